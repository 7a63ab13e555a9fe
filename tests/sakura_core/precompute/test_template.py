"""precompute_template -> manifest + blobs; validate_manifest; decode_representation of every representation."""

import copy
import json

import numpy as np
import pytest
import torch

from sakura_core.kv import (
    ManifestError,
    decode_kv,
    decode_representation,
    encode_kv,
    shard_digest,
    validate_manifest,
)
from sakura_core.precompute import PrecomputedTemplate, ProbeConfig, precompute_template


@pytest.fixture(scope="module")
def precomputed(demo_model, demo_template) -> PrecomputedTemplate:
    calls = []
    result = precompute_template(
        demo_model,
        demo_template,
        "astro",
        shard_layers=2,
        seed=3,
        probes=ProbeConfig(num_probes=3, gain_steps=2),
        held_out_probes=2,
        progress=lambda stage, done, total: calls.append((stage, done, total)),
    )
    assert ("encode", 3, 3) in calls and calls[0][0] == "kv"
    return result


def test_manifest_validates_and_is_json(precomputed, demo_model):
    m = precomputed.manifest
    validate_manifest(m)
    assert json.loads(json.dumps(m)) == m
    assert m["model_id"] == demo_model.model_id and m["template_id"] == "astro"
    assert m["num_layers"] == demo_model.adapter.num_layers
    assert [s["layers"] for s in m["shards"]] == [[0, 1], [2, 3], [4, 5]]


def test_every_digest_names_its_blob(precomputed):
    names = set()
    for shard in precomputed.manifest["shards"]:
        for rep in shard["representations"]:
            blob = precomputed.blobs[rep["digest"]]
            assert shard_digest(blob) == rep["digest"] and len(blob) == rep["bytes"]
            names.add(rep["digest"])
    assert names == set(precomputed.blobs)


def test_ladder_is_progressive_with_falling_distortion_and_an_exact_top(precomputed, demo_kv):
    for shard in precomputed.manifest["shards"]:
        reps = shard["representations"]
        sakura = [r for r in reps if r["codec"] == "sakura"]
        assert len(sakura) >= 4
        assert sakura[0]["requires"] == []
        for lower, upper in zip(sakura, sakura[1:], strict=False):
            assert upper["requires"] == lower["requires"] + [lower["digest"]]
            assert upper["total_bytes"] > lower["total_bytes"]
            # measured on held-out probes: a level that gives this shard few bits may not lower it measurably
            assert upper["distortion"] < 1.05 * lower["distortion"] + 1e-6
        assert sakura[-1]["distortion"] < 0.1 * sakura[0]["distortion"]
        fp16 = reps[-1]
        assert fp16["codec"] == "fp16" and fp16["requires"] == [] and fp16["level"] == sakura[-1]["level"] + 1
        first, last = shard["layers"]
        k, v = decode_representation([precomputed.blobs[fp16["digest"]]])
        assert torch.equal(k, demo_kv.kv[first : last + 1, 0].half()) and torch.equal(
            v, demo_kv.kv[first : last + 1, 1].half()
        )
        assert fp16["distortion"] < sakura[-1]["distortion"]


def test_every_representation_decodes_from_its_chain(precomputed):
    for shard in precomputed.manifest["shards"]:
        for rep in shard["representations"]:
            chain = [precomputed.blobs[d] for d in rep["requires"] + [rep["digest"]]]
            k, v = decode_representation(chain)
            assert k.dtype == torch.float16 and k.shape[0] == shard["layers"][1] - shard["layers"][0] + 1


def test_precompute_is_deterministic(demo_model, demo_template, precomputed):
    again = precompute_template(
        demo_model,
        demo_template,
        "astro",
        shard_layers=2,
        seed=3,
        probes=ProbeConfig(num_probes=3, gain_steps=2),
        held_out_probes=2,
    )
    assert again.manifest == precomputed.manifest and again.blobs == precomputed.blobs


def test_precompute_other_codec_and_bad_image(demo_model, demo_template):
    result = precompute_template(
        demo_model,
        demo_template,
        "astro-cg",
        codec="cachegen",
        shard_layers=3,
        probes=ProbeConfig(num_probes=2, gain_steps=0),
        held_out_probes=1,
    )
    validate_manifest(result.manifest)
    assert [r["codec"] for r in result.manifest["shards"][0]["representations"]] == ["cachegen"] * 3 + ["fp16"]
    with pytest.raises(ValueError, match="uint8"):
        precompute_template(demo_model, demo_template.astype(np.float32), "x")


def test_encode_kv_decode_kv_round_trip(demo_kv):
    chains = encode_kv("fp16", demo_kv, None, 0, shard_layers=4)
    assert torch.equal(decode_kv(chains), demo_kv.kv.half())


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("version",), 3, "version"),
        (("version",), 1, "version.*republish"),
        (("model_id",), "not-hex", "model_id"),
        (("template_id",), "Bad", "template_id"),
        (("token_grid",), [16], "token_grid"),
        (("num_layers",), 0, "num_layers"),
        (("shards", 1, "layers"), [3, 3], "shards[1].layers"),
        (("shards", 0, "representations", 0, "digest"), "xyz", "shards[0].representations[0].digest"),
        (("shards", 0, "representations", 0, "distortion"), float("nan"), "distortion"),
        (("shards", 0, "representations", 0, "bytes"), 0, "bytes"),
        (("shards", 0, "representations", 2, "requires"), [], "total_bytes"),
        (("shards", 0, "representations", 1, "requires"), ["0" * 64], "requires"),
        (("shards", 0, "representations", 1, "level"), 0, "levels"),
    ],
)
def test_validate_manifest_names_the_bad_field(precomputed, path, value, field):
    m = copy.deepcopy(precomputed.manifest)
    target = m
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ManifestError, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_manifest(m)


def test_validate_manifest_rejects_missing_shards(precomputed):
    m = copy.deepcopy(precomputed.manifest)
    m["shards"] = m["shards"][:-1]
    with pytest.raises(ManifestError, match="num_layers"):
        validate_manifest(m)
    with pytest.raises(ManifestError):
        validate_manifest([])
