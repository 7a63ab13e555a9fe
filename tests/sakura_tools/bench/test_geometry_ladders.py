"""Ladders at a geometry's shard size: the synthesis keeps the demo's channel statistics without repeats zstd could
exploit, the layer mapping keeps double and single blocks apart, and a geometry's ladder comes out of the two
measurements as the module says (fp16 bytes / (demo ratio x size factor))."""

import numpy as np
import pytest

from sakura_core.runtime.geometry import get_geometry
from sakura_tools.bench.geometry_ladders import _demo_layer, _geometry_layer, geometry_ladders, synthesize_shard


def test_synthesis_keeps_channel_statistics_and_repeats_no_row():
    rng = np.random.default_rng(0)
    src = (rng.standard_normal((2, 64, 2, 8)) * np.linspace(0.5, 3, 16).reshape(2, 8) + 1.5).astype(np.float32)
    big = synthesize_shard(src, 1024, 4, 16, rng)  # (2, 1024, 4, 16): 64 source channels per 16 target ones
    assert big.shape == (2, 1024, 4, 16) and big.dtype == np.float32
    flat_src, flat = src[0].reshape(64, -1), big[0].reshape(1024, -1)
    for c in range(flat.shape[1]):
        s = flat_src[:, c % 16]
        assert flat[:, c].mean() == pytest.approx(float(s.mean()), abs=0.25 * float(s.std()))
        assert flat[:, c].std() == pytest.approx(float(s.std()), rel=0.3)
    rows = {flat[t].tobytes() for t in range(1024)}
    assert len(rows) == 1024  # no token row repeats
    blocks = {flat[t, b * 16 : (b + 1) * 16].tobytes() for t in range(1024) for b in range(4)}
    assert len(blocks) == 4 * 1024  # nor any block of a row: nothing for zstd to match
    assert not any(np.array_equal(flat[t, :16], flat_src[i]) for t in range(50) for i in range(64))


def test_layer_mapping_keeps_double_and_single_blocks_apart():
    klein = get_geometry("klein4b-512-ref1024")  # 5 double + 20 single; the demo: 2 double + 4 single
    demo = [_demo_layer(layer, klein, 6) for layer in range(25)]
    assert set(demo[:5]) == {0, 1} and set(demo[5:]) == {2, 3, 4, 5}
    assert demo == sorted(demo)
    assert _geometry_layer(0, 6, klein) == 0 and 5 <= _geometry_layer(2, 6, klein) < 25
    phone = get_geometry("phone-dit-512")  # no double blocks: proportional
    assert [_demo_layer(layer, phone, 6) for layer in (0, 3, 4, 23)] == [0, 0, 1, 5]


def _demo(L0=6):
    # two families, 2 levels; demo shard d has ratio (2 + d) at level 0, 1 at level 1; level 0 MSE share 1e-3
    lv = lambda j, ratio: {  # noqa: E731
        "name": f"l{j}",
        "ratio": ratio,
        "mse": [1e-3] * L0,
        "psnr_db": 30.0 + 10 * j,
        "progressive": True,
        "level": j,
    }
    fams = {
        "sakura": {"codec": "sakura", "levels": [lv(0, [2.0 + d for d in range(L0)]), lv(1, [1.5] * L0)]},
        "cachegen": {"codec": "cachegen", "levels": [lv(0, [3.0] * L0), lv(1, [2.0] * L0)]},
        "fp16": {"codec": "fp16", "levels": [dict(lv(0, [1.0] * L0), name="fp16", progressive=False)]},
    }
    return {"layers": L0, "steps": 1, "shards": L0, "families": fams}


def test_a_geometry_ladder_from_the_two_measurements():
    g = get_geometry("phone-dit-512")  # 24 layers: 4 per demo layer
    eff = {
        "sakura": {"factor": [2.0, 1.0], "decode_bytes_per_s": [1e8, 5e7]},
        "cachegen": {"factor": [1.5, 1.5], "decode_bytes_per_s": [1e7, 1e7]},
        "fp16": {"factor": [1.0], "decode_bytes_per_s": [1e9]},
    }
    lad = geometry_ladders(_demo(), eff, g, "single", {})
    s = lad.families["sakura"]
    fp = g.shard_bytes_fp16
    assert s.levels == ("l0", "l1", "fp16")  # sakura ends with the exact level
    assert s.bytes[0][0] == round(fp / (2.0 * 2.0)) and s.bytes[23][0] == round(fp / (7.0 * 2.0))
    assert s.increment_bytes[0][1] == s.bytes[0][1] - s.bytes[0][0]  # progressive: an upgrade fetches the rest
    assert s.decode_s[5][1] == pytest.approx(fp / 5e7) and s.decode_s[5][2] == pytest.approx(fp / 1e9)
    assert sum(row[0] for row in s.mse) == pytest.approx(6e-3)  # the demo's MSE, shared among the 24 shards
    assert s.floor == 1  # the cheapest level with >= 35 dB (l1: 40 dB)
    assert lad.families["cachegen"].bytes[7] == (round(fp / 4.5), round(fp / 3.0))


def test_a_level_psnr_is_the_lowest_of_the_edit_and_the_manifests_held_out_edits(demo_model, monkeypatch):
    """The simulator's floor is picked by each level's PSNR: the configured edit's, lowered to what precompute's
    held-out edits measured (the manifest's ``psnr_db``) where those are worse — one edit is no margin."""
    from sakura_tools.bench import geometry_ladders as gl

    cfg = gl.LadderConfig(steps=2)
    own = gl.demo_ladders(demo_model, cfg, "single", say=lambda line: None)
    own_psnr = {lv["name"]: lv["psnr_db"] for lv in own["families"]["sakura"]["levels"]}

    seen, measured = {}, gl.manifest_psnr

    def held_out_worse(manifest):  # the held-out edits find level 3 10 dB worse than the configured edit
        psnr = measured(manifest)
        seen.update(psnr)
        return {**psnr, "sakura-l3": own_psnr["sakura-l3"] - 10.0} if "sakura-l3" in psnr else psnr

    monkeypatch.setattr(gl, "manifest_psnr", held_out_worse)
    out = gl.demo_ladders(demo_model, cfg, "single", say=lambda line: None)
    levels = {lv["name"]: lv for lv in out["families"]["sakura"]["levels"]}
    assert levels["sakura-l3"]["psnr_db"] == pytest.approx(own_psnr["sakura-l3"] - 10.0)
    for name, lv in levels.items():
        assert lv["psnr_db"] <= seen[name] + 1e-9  # never above what the held-out edits measured
        if name != "sakura-l3":
            assert lv["psnr_db"] == pytest.approx(min(own_psnr[name], seen[name]))
    # the error shares follow the level's PSNR: they sum to its all-shards MSE
    assert sum(levels["sakura-l3"]["mse"]) == pytest.approx(4 * 10 ** (-levels["sakura-l3"]["psnr_db"] / 10))


def test_manifest_psnr_keeps_each_levels_lowest():
    from sakura_tools.bench.geometry_ladders import manifest_psnr

    reps = lambda a, b: {"representations": [{"name": "l0", "psnr_db": a}, {"name": "fp16", "psnr_db": b}]}  # noqa: E731
    assert manifest_psnr({"shards": [reps(36.0, 100.0), reps(35.5, 100.0)]}) == {"l0": 35.5, "fp16": 100.0}
