"""``sakura bench lossless-top``'s measurement on a small template: the residual on the top rung restores the exact
fp16 bit for bit, and the figures add up (the serving store with a lossless top = the chain + the residual)."""

from __future__ import annotations

import pytest

from sakura_core.precompute import precompute_template
from sakura_tools.bench.cli_lossless import measure


def test_the_lossless_candidates_are_measured_and_the_residual_is_exact(demo_model, demo_template):
    pre = precompute_template(demo_model, demo_template, "tpl-lossless", held_out_probes=1, psnr_steps=1)
    row = measure(pre.manifest, pre.blobs, level=3)  # measure raises when the residual is not lossless
    assert row["top"] != "fp16" and 0 < row["headers"] < row["serving"] < 1.0
    assert row["serving_plus_lossless"] == pytest.approx(row["serving"] + row["xor_top_zstd"], abs=2e-4)
    assert 0 < row["byteplane_zstd"] <= 1.01 and 0 < row["fp16_zstd"] <= 1.01
