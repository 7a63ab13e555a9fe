"""Cross-step dependencies in a per-step manifest: which representations need another shard decoded first.

A representation of the shard (step s, layers) may carry ``"ref"``::

    {"mode": "residual", "step": r, "digest": D}   # its blobs code KV_s - KV_r: decode = (r, layers) + this chain
    {"mode": "reuse",    "step": r, "digest": D}   # zero bytes, no blob: the KV is (r, layers)'s decoded KV

``r < s``; ``D`` is the digest of the fp16 representation of the shard (r, same layers) — the identity of the exact
KV the residual was computed against; any decoded representation of that shard serves as the reference. A
``reuse`` representation has ``bytes`` 0, ``digest`` null and ``requires`` []. :func:`check_references` checks
every ``ref`` against the shards of the manifest. :class:`ManifestError` (the schema's error, re-exported by
:mod:`.manifest`) lives here so that both modules raise it.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REF_MODES", "ManifestError", "blob_digests", "check_references", "ref_mode"]


class ManifestError(ValueError):
    """A manifest does not follow the schema; the message names the offending field (e.g. ``shards[2].layers``)."""


REF_MODES = ("residual", "reuse")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def ref_mode(rep: dict, where: str, step: int | None) -> str | None:
    """``None`` for a self-contained representation, else its validated ``ref`` mode (raises ManifestError)."""
    ref = rep.get("ref")
    if ref is None:
        return None
    if step is None:
        raise ManifestError(f"manifest field '{where}.ref' is set, but cross-step references need a per-step manifest")
    if not isinstance(ref, dict) or ref.get("mode") not in REF_MODES:
        raise ManifestError(f"manifest field '{where}.ref.mode' must be one of {list(REF_MODES)}, got {ref!r}")
    r = ref.get("step")
    if not (isinstance(r, int) and not isinstance(r, bool) and 0 <= r < step):
        raise ManifestError(f"manifest field '{where}.ref.step' must be an earlier step than {step}, got {r!r}")
    if not isinstance(ref.get("digest"), str) or not _HEX64.match(ref["digest"]):
        raise ManifestError(f"manifest field '{where}.ref.digest' must be 64 lowercase hex characters")
    if ref["mode"] == "reuse" and (
        rep.get("bytes") != 0 or rep.get("digest") is not None or rep.get("requires") != []
    ):
        raise ManifestError(
            f"manifest field {where!r}: a 'reuse' representation has bytes 0, digest null, requires []"
        )
    return ref["mode"]


def check_references(shards: list[Any]) -> None:
    """Every ``ref`` names the fp16 representation of the shard (ref step, same layers) of this manifest."""
    exact = {}
    for sh in shards:
        for rep in sh["representations"]:
            if rep.get("codec") == "fp16" and rep.get("ref") is None:
                exact[(sh["step"], tuple(sh["layers"]))] = rep["digest"]
    for i, sh in enumerate(shards):
        for j, rep in enumerate(sh["representations"]):
            ref = rep.get("ref")
            if ref is None:
                continue
            want = exact.get((ref["step"], tuple(sh["layers"])))
            if want != ref["digest"]:
                raise ManifestError(
                    f"manifest field 'shards[{i}].representations[{j}].ref' names {ref['digest'][:12]}…, but the "
                    f"fp16 representation of step {ref['step']} layers {sh['layers']} is {str(want)[:12]}…"
                )


def blob_digests(manifest: dict) -> list[str]:
    """Every blob digest a manifest's representations name (their own and their chains'), without the zero-byte
    ``reuse`` representations, which have none; in manifest order, repeats included."""
    out = []
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            if rep.get("digest") is not None:
                out.append(rep["digest"])
    return out
