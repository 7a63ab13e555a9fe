"""``sakura bench codec`` on a tiny configuration: the table and the JSON schema (no timing assertions)."""

import json

from sakura_core.cli import main
from sakura_tools.bench.codec_bench import CodecBenchConfig, _interp_psnr, format_table, run_codec_bench

FIELDS = {"name", "level", "bytes", "ratio_vs_fp16", "attn_rel_err", "psnr_db", "encode_mb_s", "decode_mb_s"}


def test_run_codec_bench_rows_and_summary(demo_model):
    config = CodecBenchConfig(
        templates=("astronaut",),
        users=("chelsea",),
        steps=1,
        codecs=("fp16", "int4", "cachegen", "sakura"),
        probes=2,
        held_out_probes=1,
        repeats=1,
        phone_scale=False,
    )
    result = run_codec_bench(config, model=demo_model)
    rows = result["codecs"]
    assert all(FIELDS <= set(r) for r in rows)
    assert [(r["name"], r["level"]) for r in rows if r["name"] == "cachegen"] == [("cachegen", i) for i in range(3)]
    sakura = [r for r in rows if r["name"] == "sakura"]
    assert len(sakura) >= 4 and all(a["bytes"] < b["bytes"] for a, b in zip(sakura, sakura[1:], strict=False))
    fp16 = next(r for r in rows if r["name"] == "fp16")
    assert 0.99 < fp16["ratio_vs_fp16"] <= 1.0 and fp16["attn_rel_err"] < 1e-3  # container headers cost a little
    assert result["model"]["random_weights"] is True
    uniform = [r for r in rows if r["name"] == "sakura-uniform"]
    assert [r["level"] for r in uniform] == [r["level"] for r in sakura]  # the ablation covers every level
    abl = result["summary"]["sakura_uniform_vs_learned_equal_size"]
    assert [a["bytes"] for a in abl] == [r["bytes"] for r in uniform]
    text = format_table(result)
    assert "RANDOM weights" in text and "sakura" in text and "CacheGen level 0" in text
    assert "uniform importance" in text
    json.dumps(result, allow_nan=False)


def test_interp_psnr_is_log_linear_and_none_outside():
    curve = [(100, 30.0), (1000, 40.0)]
    assert abs(_interp_psnr(curve, 316) - 35.0) < 0.01
    assert _interp_psnr(curve, 50) is None and _interp_psnr(curve, 2000) is None


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "codec.json"
    rc = main(
        [
            "bench", "codec", "--json", str(out), "--templates", "coffee", "--users", "rocket", "--steps", "1",
            "--codecs", "fp16,sakura", "--probes", "2", "--held-out-probes", "1", "--repeats", "1",
            "--no-phone-scale", "--weights", "random",
        ]
    )  # fmt: skip # keep: flags beside their values
    assert rc == 0
    data = json.loads(out.read_text())
    assert {r["name"] for r in data["codecs"]} == {"fp16", "sakura", "sakura-uniform"}
    printed = capsys.readouterr().out
    assert "dec MB/s" in printed and str(out) in printed


def test_cli_rejects_unknown_codec(tmp_path, capsys):
    assert main(["bench", "codec", "--json", str(tmp_path / "x.json"), "--codecs", "zip"]) == 2
    assert "unknown codec" in capsys.readouterr().err
