"""The ``sakura`` console script and ``sakura demo``."""

import importlib.metadata
import json

import pytest

from sakura_core.cli import main


def test_demo_writes_images_and_an_exact_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "2", "--no-served"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["exact"] is True
    assert {r["name"] for r in report["runs"]} >= {"on-device", "fetched-kv", "hybrid"}
    for name in report["images"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "exact KV reuse: True" in text and "exact per-step KV reuse: True" in text
    per_step = report["per_step"]
    assert per_step["exact"] is True and per_step["kv_shape"][:2] == [2, report["model"]["layers"]]
    assert {r["name"] for r in per_step["runs"]} == {"on-device", "fetched-kv", "hybrid"}


def test_unknown_command_exits_2_and_lists_commands(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command" in err and "sakura demo" in err


@pytest.mark.parametrize("argv", [["phone"], ["phone", "--help"], ["bench", "-h"]])
def test_a_command_group_lists_its_commands(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("  sakura ")]
    assert rows and all(r[1] == argv[0] for r in rows)
    assert "sakura demo" not in out


def test_an_unknown_command_in_a_group_is_still_refused(capsys):
    assert main(["phone", "frobnicate"]) == 2
    assert "unknown command 'phone frobnicate'" in capsys.readouterr().err


def test_installed_distribution_has_no_top_level_nodes_package():
    top = importlib.metadata.distribution("sakura-kv").read_text("top_level.txt") or ""
    names = set(top.split())
    assert "nodes" not in names
    assert {"sakura_core", "cloud_server", "android_bridge"} <= names


@pytest.mark.slow
def test_demo_served_part_runs_every_policy_over_the_shaped_link(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    served = {r["policy"]: r for r in report["served"]["runs"] if r["kv_mode"] == "single"}
    per_step = {r["policy"]: r for r in report["served"]["runs"] if r["kv_mode"] == "per-step"}
    assert set(per_step) == {"on-device", "fetch-fp16", "sakura"} and per_step["on-device"]["bytes_fetched"] == 0
    assert per_step["fetch-fp16"]["psnr_db"] >= 40 and per_step["fetch-fp16"]["split_layers"] == [0, 0]
    assert all(not r["fallbacks"] for r in per_step.values())
    assert (out / "timeline_per_step.png").read_bytes()[:4] == b"\x89PNG"
    assert set(served) == {"on-device", "on-device-cached", "fetch-fp16", "cachegen", "throughput", "sakura"}
    assert served["on-device-cached"]["bytes_fetched"] == 0 and served["fetch-fp16"]["bytes_fetched"] > 0
    assert served["fetch-fp16"]["psnr_db"] >= 40  # fp16 KV: the exact edit up to rounding
    assert all(not r["fallbacks"] for r in served.values())
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
