"""rungs_from_manifest on a tiny hand-written manifest: order, chain bytes, decode time, distortion, errors."""

import pytest
from typed_manifests import unchecked_manifest

from sakura_core.policy.ladder import CrossStepLinks, Level, levels_of, rungs_from_manifest


def manifest(layers=(0, 1), psnr=True) -> dict:
    """Two one-layer shards, each with s1 (10 B), s2 (s1 + a 5 B enhancement) and fp16 (64 B), listed out of
    order; a 2x2 token grid, 1 head of dim 4: one layer's K and V in fp16 = 2 x 4 x 1 x 4 x 2 B = 64 B."""
    shards = []
    for i in layers:
        reps = [
            {"name": "fp16", "level": 2, "bytes": 64, "digest": f"f{i}", "distortion": 0.0},
            {"name": "s2", "level": 1, "bytes": 5, "digest": f"b{i}", "requires": [f"a{i}"], "distortion": 0.01},
            {"name": "s1", "level": 0, "bytes": 10, "digest": f"a{i}", "distortion": 0.03},
        ]
        if psnr:
            reps[1]["psnr_db"], reps[2]["psnr_db"] = 40.0, 30.0
        shards.append({"layers": [i, i], "representations": reps})
    return {"num_layers": 2, "token_grid": [2, 2], "heads": 1, "head_dim": 4, "shards": shards}


def test_levels_are_cheapest_first_with_chain_bytes_and_decode_time():
    rungs = rungs_from_manifest(unchecked_manifest(manifest()), decode_bytes_per_s=640)
    s1, s2, fp16 = levels_of(rungs)[1]
    assert [r.rep.name for r in rungs[1]] == ["s1", "s2", "fp16"]
    assert (s1.nbytes, s1.increment_bytes, s1.progressive) == (10, 10, False)
    assert (s2.nbytes, s2.increment_bytes, s2.progressive) == (15, 5, True)  # 10 B base + 5 B enhancement
    assert (fp16.nbytes, fp16.increment_bytes, fp16.progressive) == (64, 64, False)
    assert s1.decode_s == s2.decode_s == fp16.decode_s == pytest.approx(0.1)  # 64 B decoded at 640 B/s


def test_distortion_from_psnr_then_from_the_manifest_distortion():
    # PSNR p dB over images in [-1, 1] (peak-to-peak 2, so MSE = 4 x 10^(-p/10)), spread over 2 layers
    ladders = levels_of(rungs_from_manifest(unchecked_manifest(manifest()), 640))
    assert [lv.mse for lv in ladders[0]] == pytest.approx([4e-3 / 2, 4e-4 / 2, 0.0])  # 30 dB, 40 dB, distortion 0
    ladders = levels_of(rungs_from_manifest(unchecked_manifest(manifest()), 640, level_psnr_db={"s1": 20.0}))
    assert ladders[0][0].mse == pytest.approx(4e-2 / 2)  # the measured 20 dB wins over the manifest's 30 dB
    ladders = levels_of(rungs_from_manifest(unchecked_manifest(manifest(psnr=False)), 640))
    assert ladders[0][0].mse == pytest.approx(0.03**2 / 2)  # no PSNR anywhere: distortion^2 per layer


def test_an_empty_enhancement_is_not_progressive():
    m = manifest()
    m["shards"][0]["representations"][1]["bytes"] = 0  # s2 adds nothing to s1's 10 B
    ladders = levels_of(rungs_from_manifest(unchecked_manifest(m), 640))
    assert ladders[0][1].nbytes == 10 and not ladders[0][1].progressive


def test_grouped_or_missing_shards_are_explained():
    m = manifest()
    m["shards"][0]["layers"] = [0, 1]
    with pytest.raises(ValueError, match="one layer per shard; shard 0-1 groups layers"):
        rungs_from_manifest(unchecked_manifest(m), 640)
    with pytest.raises(ValueError, match=r"lacks shards for layers \[1\]"):
        rungs_from_manifest(unchecked_manifest(manifest(layers=(0,))), 640)


def test_a_levels_cross_step_links_are_one_part_read_flat_and_set_by_with_links():
    twin = Level("lo+cl", 4, 4, 0.0, 1e-5, links=CrossStepLinks(ref_step=0))
    lv = Level("lo", 8, 8, 0.0, 1e-4, links=CrossStepLinks(ref_step=0, closed=twin))
    assert (lv.ref_step, lv.reuse, lv.closed, lv.off_track) == (0, False, twin, None)
    floored = lv.with_links(off_track=2)
    assert floored.links == CrossStepLinks(ref_step=0, closed=twin, off_track=2) and floored.nbytes == lv.nbytes
    assert floored.expected_nbytes == 4 and lv.expected_nbytes == 8  # below the open-loop floor: planned as the twin
    with pytest.raises(ValueError, match="reuse rung fetches nothing"):
        Level("reuse", 8, 8, 0.0, 1e-4, links=CrossStepLinks(ref_step=0, reuse=True))
