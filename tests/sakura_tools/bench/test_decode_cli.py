"""``sakura bench decode``: both codecs' ladders measured in one run on one shard, a table and JSON; bad sizes refused."""

import json

from sakura_core.cli import main


def test_bench_decode_measures_both_ladders_and_writes_json(tmp_path, capsys):
    out = tmp_path / "decode.json"
    args = ["--tokens", "64", "--heads", "2", "--head-dim", "16", "--repeats", "1", "--data", "gaussian"]
    assert main(["bench", "decode", *args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {c: [r for r in data["rows"] if r["codec"] == c] for c in ("sakura", "cachegen")}
    assert len(rows["sakura"]) > 1 and rows["cachegen"] and data["fp16_bytes"] == 2 * 2 * 64 * 2 * 16
    wire = [r["wire_bytes"] for r in rows["sakura"]]
    assert wire == sorted(wire) and all(r["decode_s"] > 0 for r in data["rows"])  # a progressive ladder grows
    assert "wire Mbit/s" in capsys.readouterr().out
    assert main(["bench", "decode", "--tokens", "50", "--json", str(out)]) == 2  # not a multiple of 32
