"""``sakura bench store-catalog`` at a small size (6 templates, both KV modes) on the session's radosgw: every entry
is published in the serving profile, ``store usage``'s total equals the per-template figures and the bytes the
publishers wrote, the bucket's shard objects match, ``store verify`` is clean, and the JSON holds what was printed."""

from __future__ import annotations

import json

import pytest

from sakura_core.cli import main
from sakura_tools.infra.bench_store_catalog import template_images

from .conftest import S3_BUCKET


def test_the_template_images_are_distinct_crops(tmp_path):
    paths = template_images(tmp_path, 16, seed=0)
    assert len({p.read_bytes() for p in paths}) == 16  # 14 photographs' centres, then seeded crops
    (tmp_path / "again").mkdir()
    again = template_images(tmp_path / "again", 16, seed=0)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths]  # seeded: the same catalog each run


@pytest.mark.slow
def test_a_small_catalog_in_s3_adds_up_and_verifies(radosgw, tmp_path, capsys):
    out = tmp_path / "store-catalog.json"
    argv = [
        "bench",
        "store-catalog",
        "--templates",
        "6",
        "--workers",
        "1",
        "--steps",
        "2",
        "--json",
        str(out),
        "--s3",
        f"s3://{S3_BUCKET}/store-catalog",
        "--s3-endpoint",
        radosgw.endpoint_url,
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    m = report["measured"]
    assert all(m["checks"].values()), m["checks"]
    assert [(r["kv_mode"], r["templates"]) for r in m["by_mode"]] == [("single", 3), ("per-step", 3)]
    assert m["usage_total"]["templates"] == 6
    assert m["usage_total"]["stored_bytes"] == sum(t["stored_bytes"] for t in m["templates"])
    assert {t["profile"] for t in m["templates"]} == {"serving"} and not any(t["fp16_stored"] for t in m["templates"])
    assert str(m["usage_total"]["stored_bytes"]) in printed and "FAIL" not in printed
