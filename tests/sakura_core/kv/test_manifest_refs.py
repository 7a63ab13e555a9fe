"""Manifest version 2's cross-step fields, checked by the one schema (``parse_manifest``): a residual's ``ref`` names
the fp16 of the same layers at an earlier step; a ``reuse`` rung has no blob; a version-1 manifest is refused naming
the fix."""

from __future__ import annotations

import copy

import pytest

from sakura_core.kv.manifest import ManifestError, blob_digests, parse_manifest

from ...synthetic_templates import build_cross_step_synthetic

MODEL_ID = "ab" * 32


@pytest.fixture
def manifest():
    return build_cross_step_synthetic("xs", model_id=MODEL_ID, steps=3).manifest


def _shard(m, step, layer):
    return next(s for s in m["shards"] if s["step"] == step and s["layers"][0] == layer)


def test_a_cross_step_manifest_parses_and_its_reuse_rungs_name_no_blob(manifest):
    parsed = parse_manifest(manifest, template_id="xs", model_id=MODEL_ID)
    assert parsed.kv_mode == "per-step" and parsed.schedule.steps == 3
    digests = blob_digests(manifest)
    reps = [r for s in manifest["shards"] for r in s["representations"]]
    assert len(digests) == len(reps) - 4 and None not in digests  # 2 layers x steps 1-2 have a reuse rung


def _mutated(manifest, fn):
    m = copy.deepcopy(manifest)
    fn(m)
    return m


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda m: _shard(m, 1, 0)["representations"][0].update(bytes=10), "'reuse' representation has bytes 0"),
        (lambda m: _shard(m, 1, 0)["representations"][0].update(digest="cd" * 32), "digest null"),
        (lambda m: _shard(m, 1, 0)["representations"][1]["ref"].update(step=1), "ref.step' must be an earlier step"),
        (lambda m: _shard(m, 2, 1)["representations"][1]["ref"].update(step=-1), "earlier step than 2"),
        (lambda m: _shard(m, 1, 0)["representations"][1]["ref"].update(mode="xor"), "ref.mode' must be one of"),
        (lambda m: _shard(m, 1, 0)["representations"][1]["ref"].update(digest="zz"), "ref.digest' must be 64"),
        # a residual against the fp16 of another layer, or of another step than the one it names
        (
            lambda m: _shard(m, 1, 0)["representations"][1]["ref"].update(
                digest=_shard(m, 0, 1)["representations"][-1]["digest"]
            ),
            "fp16 representation of step 0",
        ),
        (lambda m: _shard(m, 2, 0)["representations"][1]["ref"].update(step=0), "fp16 representation of step 0"),
        (lambda m: _shard(m, 1, 0)["representations"][0].pop("name"), "name' must be a non-empty string"),
    ],
)
def test_a_bad_reference_is_refused_naming_the_field(manifest, mutate, problem):
    with pytest.raises(ManifestError, match=problem):
        parse_manifest(_mutated(manifest, mutate))


def test_a_reference_needs_a_per_step_manifest():
    from ...synthetic_templates import build_synthetic

    m = build_synthetic("single", model_id=MODEL_ID).manifest
    m["shards"][1]["representations"][0]["ref"] = {"mode": "residual", "step": 0, "digest": "ab" * 32}
    with pytest.raises(ManifestError, match=r"shards\[1\].representations\[0\].ref' is set, but cross-step"):
        parse_manifest(m)


def test_a_version_1_manifest_is_refused_naming_the_fix(manifest):
    with pytest.raises(
        ManifestError, match="'version' is 1: the template was published before shard format 2.*republish it"
    ):
        parse_manifest({**manifest, "version": 1})
    with pytest.raises(ManifestError, match="'version' must be 2, got 3"):
        parse_manifest({**manifest, "version": 3})
