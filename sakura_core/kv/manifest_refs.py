"""A per-step manifest's cross-step ``ref`` fields (manifest version 2), checked by the schema
(:mod:`.manifest_schema` calls these)::

    {"mode": "residual", "step": r, "digest": D}   # its blobs code KV_s - KV_r: decode = (r, layers) + this chain
    {"mode": "reuse",    "step": r, "digest": D}   # zero bytes, no blob: the KV is (r, layers)'s decoded KV
    {"mode": "closed",   "step": r, "digest": T}   # a closed-loop twin "<level>+cl": KV_s - a * (r, layers)
                                                   # decoded as the representation T (<level> or <level>+cl)

``r < s``; ``D``: the fp16 digest of shard (r, same layers) (its ``exact_digest`` where the fp16 is not stored), the
exact KV the residual was computed against (any decoded representation of it serves as the reference). ``reuse``: ``bytes`` 0, ``digest`` null, ``requires`` [].
``T``: the one representation of shard (r, same layers) a twin decodes against (its level's track).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from .manifest_errors import ManifestError
from .names import CLOSED_SUFFIX, base_level_name, is_digest

__all__ = ["CLOSED_REF_MODE", "DECODED_REF_MODES", "REF_MODES", "check_cross_step_refs", "ref_mode"]

#: A representation's cross-step ``ref`` modes (per-step manifests only).
REF_MODES = ("residual", "reuse", "closed")  # closed: a twin coded against one representation (its digest)
#: The ``ref`` modes whose blobs decode against the reference's KV (their headers name it).
DECODED_REF_MODES = ("residual", "closed")
#: A closed-loop twin's ``ref`` mode: it decodes against one representation of its reference (``ref.digest``).
CLOSED_REF_MODE = "closed"


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def ref_mode(rep: Any, w: str, step: int | None) -> str | None:
    """``None`` for a self-contained representation, else its ``ref`` mode, checked (``step``: the shard's step, None
    in single mode). A reuse representation's level and name are checked here too (it skips the blob checks)."""
    if not isinstance(rep, dict) or rep.get("ref") is None:
        return None
    ref = rep["ref"]
    if step is None:
        raise ManifestError(f"manifest field '{w}.ref' is set, but cross-step references need a per-step manifest")
    if not isinstance(ref, dict) or ref.get("mode") not in REF_MODES:
        raise ManifestError(f"manifest field '{w}.ref.mode' must be one of {list(REF_MODES)}, got {ref!r}")
    r = ref.get("step")
    if not (_is_int(r) and 0 <= r < step):
        raise ManifestError(f"manifest field '{w}.ref.step' must be an earlier step than {step}, got {r!r}")
    if not is_digest(ref.get("digest")):
        raise ManifestError(f"manifest field '{w}.ref.digest' must be 64 lowercase hex characters")
    if ref["mode"] == "reuse":
        level = rep.get("level")
        if not _is_int(level) or level < 0:
            raise ManifestError(f"manifest field '{w}.level' must be an int >= 0, got {level!r}")
        if not isinstance(rep.get("name"), str) or not rep["name"]:
            raise ManifestError(f"manifest field '{w}.name' must be a non-empty string, got {rep.get('name')!r}")
        if rep.get("bytes") != 0 or rep.get("digest") is not None or rep.get("requires") != []:
            raise ManifestError(
                f"manifest field {w!r}: a 'reuse' representation has bytes 0, digest null, requires []"
            )
    return ref["mode"]


def _check_closed_ref(rep: dict, ref: dict, ref_name: str | None, ref_names: set[str], w: str, layers) -> None:
    """A closed-loop twin (``ref.mode`` closed) is named ``<level>+cl`` and codes against its level's track: the
    representation of the shard (ref step, same layers, whose names are ``ref_names``) named ``<level>+cl`` where
    that shard has one, else ``<level>`` (step 0 roots the tracks)."""
    name = rep["name"]
    if not name.endswith(CLOSED_SUFFIX):
        raise ManifestError(
            f"manifest field '{w}.name': a closed-loop representation is named '<level>{CLOSED_SUFFIX}', got {name!r}"
        )
    want = name if name in ref_names else base_level_name(name)
    if ref_name != want:
        raise ManifestError(
            f"manifest field '{w}.ref' names {ref['digest'][:12]}…, which is not {want} (the track of "
            f"{base_level_name(name)}) of step {ref['step']} layers {layers}"
            + ("" if ref_name is None else f" but {ref_name}")
        )


def check_cross_step_refs(shards: list[dict]) -> None:
    """Every ``ref`` names the fp16 representation of the shard (ref step, same layers) of this manifest, or that
    shard's ``exact_digest`` where its fp16 is not stored (serving profile) — a closed-loop twin's names its level's
    track representation there (:func:`_check_closed_ref`)."""
    exact, named, names = {}, {}, {}
    for sh in shards:
        at = (sh["step"], tuple(sh["layers"]))
        names[at] = {rep["name"] for rep in sh["representations"]}
        if sh.get("exact_digest") is not None:  # a serving-profile shard: its fp16 is not stored, but named
            exact[at] = sh["exact_digest"]
        for rep in sh["representations"]:
            if rep.get("codec") == "fp16" and rep.get("ref") is None:
                exact[at] = rep["digest"]
            if rep.get("digest") is not None:
                named[(at[0], at[1], rep["digest"])] = rep["name"]
    for i, sh in enumerate(shards):
        for j, rep in enumerate(sh["representations"]):
            ref = rep.get("ref")
            if ref is None:
                continue
            if ref["mode"] == CLOSED_REF_MODE:
                at = (ref["step"], tuple(sh["layers"]))
                _check_closed_ref(
                    rep,
                    ref,
                    named.get((*at, ref["digest"])),
                    names.get(at, set()),
                    f"shards[{i}].representations[{j}]",
                    sh["layers"],
                )
                continue
            want = exact.get((ref["step"], tuple(sh["layers"])))
            if want != ref["digest"]:
                raise ManifestError(
                    f"manifest field 'shards[{i}].representations[{j}].ref' names {ref['digest'][:12]}…, but the "
                    f"fp16 representation of step {ref['step']} layers {sh['layers']} is {str(want)[:12]}…"
                )
