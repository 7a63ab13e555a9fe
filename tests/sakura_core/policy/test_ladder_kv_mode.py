"""Per-step manifests give one ladder per (step, layer) in execution order g = step * L + layer, never a step's KV
in another step's slot."""

import pytest
from typed_manifests import unchecked_manifest

from sakura_core.policy import rungs_from_manifest


def _rep(digest):
    return {"name": "fp16", "level": 0, "digest": digest, "bytes": 10, "psnr_db": 60.0}


def _manifest(shards):
    return {
        "template_id": "t",
        "kv_mode": "per-step",
        "num_layers": 2,
        "schedule": {"steps": 2},
        "token_grid": [1, 1],
        "heads": 1,
        "head_dim": 1,
        "shards": shards,
    }


def test_per_step_ladders_follow_step_then_layer():
    # shards listed out of order: the ladders still come out at g = step * L + layer
    shards = [{"step": s, "layers": [i, i], "representations": [_rep(f"{s}{i}")]} for s in (1, 0) for i in (1, 0)]
    rungs = rungs_from_manifest(unchecked_manifest(_manifest(shards)), 1e9)
    assert [lad[0].rep.digest for lad in rungs] == ["00", "01", "10", "11"]


def test_a_missing_step_shard_is_named():
    shards = [{"step": 0, "layers": [i, i], "representations": [_rep(f"0{i}")]} for i in (0, 1)]
    with pytest.raises(ValueError, match="step 1 layer 0, step 1 layer 1"):
        rungs_from_manifest(unchecked_manifest(_manifest(shards)), 1e9)
