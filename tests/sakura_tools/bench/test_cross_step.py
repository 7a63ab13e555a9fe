"""Cross-step coding of per-step KV: closed-loop residuals beat independent steps at equal bytes; interpolation."""

import math

import pytest

from sakura_core import cli
from sakura_tools.bench.cross_step import CrossStepConfig, bytes_at_psnr


def test_bytes_at_psnr_interpolates_log_bytes_linearly_in_db():
    curve = [(100, 20.0), (400, 30.0), (1600, 40.0)]
    assert bytes_at_psnr(curve, 30.0) == pytest.approx(400)
    assert bytes_at_psnr(curve, 25.0) == pytest.approx(200)  # geometric midpoint
    assert bytes_at_psnr(curve, 45.0) is None and bytes_at_psnr(curve, 10.0) is None


@pytest.mark.slow
def test_cli_cross_step_codes_residuals_better_than_independent_steps(tmp_path, capsys):
    out = tmp_path / "xs.json"
    args = ["bench", "cross-step", "--json", str(out), "--users", "coffee", "--steps", "2", "--probes", "1"]
    assert cli.main(args + ["--weights", "random"]) == 0  # tests do not depend on the trained weights
    import json

    res = json.loads(out.read_text())
    rows = {(r["store"], r["level"]): r for r in res["rows"]}
    levels = sorted({lv for _, lv in rows})
    better = 0
    for lv in levels:
        ind, cross = rows[("per-step-independent", lv)], rows[("per-step-cross", lv)]
        assert math.isfinite(ind["psnr_db"]) and math.isfinite(cross["psnr_db"])
        # about the same bytes (same bits per value), a better reconstruction: the residual is small
        assert cross["bytes"] <= 1.1 * ind["bytes"] and cross["psnr_db"] >= ind["psnr_db"]
        better += cross["psnr_db"] > ind["psnr_db"] + 1.0
    assert better >= len(levels) - 1  # the top level may reach the 100 dB cap in both
    assert res["fp16_bytes"]["per-step"] == 2 * res["fp16_bytes"]["single"]
    assert "cross-step" in capsys.readouterr().out
    with pytest.raises(ValueError, match="steps must be >= 2"):
        CrossStepConfig(steps=1)
