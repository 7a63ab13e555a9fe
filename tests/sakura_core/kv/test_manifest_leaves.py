"""The manifest typed to the leaves: ``parse_manifest`` builds each shard, representation and cross-step reference
as frozen objects with their bounds, ``Manifest.to_json`` is the one way back to the JSON, and no module past the
parser reads a manifest's ``.raw``."""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest

from sakura_core.kv.manifest import CrossStepRef, Manifest, Representation, Shard, blob_digests, parse_manifest

from ...synthetic_templates import build_cross_step_synthetic

MODEL_ID = "ab" * 32
ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("sakura_core", "cloud_server", "android_bridge", "nodes")
#: ``.raw`` reads that are not of a manifest: (file, expression) -> what it is.
NOT_A_MANIFEST = {("cloud_server/phone_page.py", "sent.raw"): "a cached vendor file's uncompressed bytes"}


@pytest.fixture
def manifest() -> dict:
    return build_cross_step_synthetic("xs", model_id=MODEL_ID, steps=3).manifest


def test_every_shard_and_representation_is_typed_as_the_json_says(manifest):
    parsed = parse_manifest(manifest, template_id="xs", model_id=MODEL_ID)
    assert len(parsed.shards) == len(manifest["shards"]) and all(isinstance(s, Shard) for s in parsed.shards)
    for shard, js in zip(parsed.shards, manifest["shards"], strict=True):
        assert (list(shard.layers), shard.step) == (js["layers"], js["step"]) and shard.exact_digest is None
        for rep, jr in zip(shard.representations, js["representations"], strict=True):
            want = (jr["level"], jr["name"], jr["bytes"], jr["digest"], jr["requires"])
            assert (rep.level, rep.name, rep.nbytes, rep.digest, list(rep.requires)) == want
            ref = jr.get("ref")
            assert rep.ref == (None if ref is None else CrossStepRef(ref["mode"], ref["step"], ref["digest"]))
    reuse = [r for s in parsed.shards for r in s.representations if r.ref_mode == "reuse"]
    assert len(reuse) == 4 and all(r.digest is None and r.nbytes == 0 and r.chain_digests == [] for r in reuse)
    assert blob_digests(parsed) == blob_digests(manifest)  # the typed and the JSON reading agree


def test_to_json_is_the_manifest_as_received_and_a_copy(manifest):
    parsed = parse_manifest(copy.deepcopy(manifest))
    out = parsed.to_json()
    assert out == manifest
    out["shards"].clear()  # a reader's change to its copy does not reach the parsed manifest
    assert parsed.to_json() == manifest and len(parsed.shards) == len(manifest["shards"])
    assert "raw" not in {f.name for f in dataclasses.fields(Manifest)} and not hasattr(parsed, "raw")


def test_the_leaves_are_frozen_and_keep_their_bounds():
    rep = Representation(level=0, name="s1", nbytes=10, digest="a" * 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.nbytes = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="must be >= 0"):
        Representation(level=-1, name="s1", nbytes=10, digest="a" * 64)
    with pytest.raises(ValueError, match="only a reuse representation has no digest"):
        Representation(level=0, name="s1", nbytes=10, digest=None)
    with pytest.raises(ValueError, match="first <= last"):
        Shard((2, 1), None, (rep,))
    with pytest.raises(ValueError, match="a step is >= 0"):
        CrossStepRef("residual", -1, "a" * 64)


def _raw_reads(source: str) -> list[str]:
    """Every ``X.raw`` expression of a module's source."""
    return [ast.unparse(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and n.attr == "raw"]


def test_the_scan_finds_a_raw_read():
    assert _raw_reads("m = parse_manifest(x)\nplan_fetch(m.raw, 'sakura')\n") == ["m.raw"]
    assert _raw_reads("m = parse_manifest(x)\nplan_fetch(m, 'sakura')\n") == []


def test_no_manifest_raw_outside_the_parser():
    """Past ``parse_manifest`` a manifest is read through its typed fields (``to_json`` where the JSON itself is
    needed): a ``.raw`` read anywhere in the packages but ``kv/manifest*.py`` fails here."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("sakura_core/kv/manifest"):
                continue
            found += [(rel, expr) for expr in _raw_reads(path.read_text()) if (rel, expr) not in NOT_A_MANIFEST]
    assert found == []
