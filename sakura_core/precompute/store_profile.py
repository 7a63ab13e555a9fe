"""Which representations a template keeps in the store: its store profile, chosen at precompute.

``full`` keeps everything precompute encodes: every level, the closed-loop twins and residuals of every level, and
the exact fp16 of every shard (the fetch-fp16 baseline and the exactness tests read it). ``serving`` keeps the rungs
a client fetches, measured by their ``psnr_db``:

* the quality floor (the cheapest level reaching ``floor_psnr_db``, on the closed-loop twins' track where the template
  has twins) and the upgrades above it up to the top rung, the cheapest level reaching ``top_psnr_db`` (a progressive
  chain keeps the levels below the floor too: they are the chain's blobs; a non-progressive ladder drops them);
* per-step templates coded across steps: step 0's chain up to the top, then per later step the closed-loop twins of
  the floor and the top (the twins' track), the open-loop floor (what a layer off its track fetches: the cheapest
  open-loop residual level reaching ``floor_psnr_db``) and the zero-byte ``reuse`` rung;
* not the fp16, nor the levels above the top, nor the residual levels and twins no policy fetches.

A template none of whose levels reaches ``top_psnr_db`` keeps its fp16 as the top rung. Residuals and ``reuse`` rungs
still name their reference by the reference shard's fp16 digest, which a serving manifest records per shard as
``exact_digest`` (the exact KV's name: the residual decodes against whatever the client holds of it). A client asking
for a level the store does not hold gets the nearest one it does (:func:`sakura_core.policy.ladder.
rungs_from_manifest`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ..kv.names import base_level_name
from ..kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES

__all__ = ["StoreProfile", "apply_store_profile", "serving_rungs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreProfile:
    """A store profile (:data:`~sakura_core.kv.storage.STORE_PROFILES`).

    Attributes:
        name: ``serving`` (default) or ``full``.
        floor_psnr_db: the quality floor's target, dB (the policies' ``FLOOR_PSNR_DB``).
        top_psnr_db: the top rung's target, dB: the cheapest level (on its twins' track) reaching it is the highest
            one ``serving`` keeps.
    """

    name: str = DEFAULT_STORE_PROFILE
    floor_psnr_db: float = 35.0
    top_psnr_db: float = 45.0

    def __post_init__(self) -> None:
        if self.name not in STORE_PROFILES:
            raise ValueError(f"store profile {self.name!r} is unknown: pick one of {', '.join(STORE_PROFILES)}")
        if not 0 < self.floor_psnr_db <= self.top_psnr_db:
            raise ValueError(
                f"store profile: need 0 < floor_psnr_db <= top_psnr_db, got {self.floor_psnr_db} and "
                f"{self.top_psnr_db} dB; raise top_psnr_db or lower the floor"
            )


def _kind(rep: dict) -> str:
    mode = (rep.get("ref") or {}).get("mode")
    return mode or ("fp16" if rep["name"] == "fp16" else "own")


def _psnr_by(shards: list[dict], kind: str) -> dict[str, float | None]:
    """Per level name (ladder order) the ``psnr_db`` of the representations of ``kind`` (a twin under its level's)."""
    out: dict[str, float | None] = {}
    for sh in shards:
        for rep in sh["representations"]:
            if _kind(rep) == kind:
                out.setdefault(base_level_name(rep["name"]), rep.get("psnr_db"))
    return out


def _cheapest(names: list[str], psnr: dict[str, float | None], target_db: float) -> str | None:
    return next((n for n in names if (p := psnr.get(n)) is not None and p >= target_db), None)


def _keep_names(shards: list[dict], profile: StoreProfile, progressive: bool) -> dict[str, set[str]] | None:
    """Per kind (``own``, ``residual``, ``closed``, ``fp16``) the level names ``serving`` keeps; None when the
    template's levels carry no ``psnr_db`` (nothing to choose by)."""
    cost: dict[tuple[str, str], int] = {}
    for sh in shards:
        for rep in sh["representations"]:
            key = (base_level_name(rep["name"]), _kind(rep))
            cost[key] = cost.get(key, 0) + rep["bytes"]
    return serving_rungs(
        _psnr_by(shards, "own"), _psnr_by(shards, "residual"), _psnr_by(shards, "closed"), cost, profile, progressive
    )


def serving_rungs(
    own: dict[str, float | None],
    open_loop: dict[str, float | None],
    twins: dict[str, float | None],
    cost: Mapping[tuple[str, str], float],
    profile: StoreProfile,
    progressive: bool,
) -> dict[str, set[str]] | None:
    """The rungs ``serving`` keeps, from per-level measurements alone (the store and the simulator's serving view,
    :mod:`sakura_tools.bench.serving_ladders`, choose by this one rule).

    ``own``, ``open_loop``, ``twins``: level name (ladder order, no ``fp16``) -> the output PSNR (dB) of the edit with
    every shard at the level as coded on its own (step 0's chain, or single mode), as open-loop cross-step residuals,
    as closed-loop twins (empty dicts where the template has none). ``cost``: (level, kind) -> its stored bytes (any
    unit; compared only). Returns per kind (``own``, ``residual``, ``closed``, ``fp16``) the level names kept, or None
    when no level has a PSNR."""
    names = list(own)
    if not names or all(p is None for p in own.values()):
        return None
    track = {n: twins.get(n) if twins.get(n) is not None else open_loop.get(n, own[n]) for n in names}
    floor = _cheapest(names, track, profile.floor_psnr_db)
    top, top_kind = _top(cost, names, track, open_loop, twins, profile.top_psnr_db)
    if floor is None:  # no level reaches the floor: clients fetch the exact level
        return {"own": set(), "residual": set(), "closed": set(), "fp16": {"fp16"}}
    upto = names[: names.index(top) + 1] if top is not None else names
    keep_own = set(upto if progressive else upto[names.index(floor) :])
    if not twins:
        return {
            "own": keep_own,
            "residual": set(upto[names.index(floor) :]),
            "closed": set(),
            "fp16": set() if top is not None else {"fp16"},
        }
    open_floor = _cheapest(list(open_loop), open_loop, profile.floor_psnr_db) or list(open_loop)[-1]
    top_named: set[str] = set() if top is None else {top}  # _top gives (None, "closed") when no level reaches it
    top_twin = top_named if top_kind == "closed" else (set() if top else set(upto[-1:]))
    return {
        "own": keep_own,
        "residual": {open_floor} | (top_named if top_kind == "residual" else set()),
        "closed": {floor} | top_twin,
        "fp16": set() if top is not None else {"fp16"},
    }


def _top(cost, names, track, open_loop, twins, top_db: float) -> tuple[str | None, str]:
    """The top rung (level name, kind): the cheapest level whose track reaches ``top_db`` — per-step, of its twins
    (``closed``) and its open-loop residuals (``residual``), whichever reaching it stores fewer bytes."""
    if not twins:
        return _cheapest(names, track, top_db), "own"
    options = [
        (cost[(n, kind)], names.index(n), n, kind)
        for kind, psnr in (("closed", twins), ("residual", open_loop))
        for n in names
        if psnr.get(n) is not None and psnr[n] >= top_db and (n, kind) in cost
    ]
    return (min(options)[2], min(options)[3]) if options else (None, "closed")


def apply_store_profile(manifest: dict, blobs: dict[str, bytes], profile: StoreProfile, progressive: bool):
    """(manifest, blobs) as ``profile`` publishes them: the manifest records ``store_profile`` and lists only the
    representations kept (a per-step shard names its exact KV's digest in ``exact_digest``), ``blobs`` only theirs.
    ``progressive``: the ladder's levels are a chain (their lower levels are kept with them)."""
    if profile.name == "full":
        return {**manifest, "store_profile": "full"}, blobs
    keep = _keep_names(manifest["shards"], profile, progressive)
    if keep is None:
        logger.warning(
            "template %s: no level has a measured psnr_db, so the serving profile cannot choose its rungs: "
            "every representation is kept (store profile full)",
            manifest["template_id"],
        )
        return {**manifest, "store_profile": "full"}, blobs
    per_step = manifest.get("kv_mode") == "per-step"
    shards = [_kept_shard(sh, keep, per_step) for sh in manifest["shards"]]
    named = {r["digest"] for sh in shards for r in sh["representations"] if r["digest"] is not None}
    return {**manifest, "store_profile": "serving", "shards": shards}, {d: b for d, b in blobs.items() if d in named}


def _kept_shard(shard: dict, keep: dict[str, set[str]], per_step: bool) -> dict:
    """``shard`` with the representations ``keep`` names (and every blob their chains require)."""
    reps = shard["representations"]
    kept = [r for r in reps if _kind(r) == "reuse" or base_level_name(r["name"]) in keep.get(_kind(r), ())]
    needed = {d for r in kept for d in r["requires"]}
    kept = [r for r in reps if r in kept or r["digest"] in needed]
    out = {**shard, "representations": kept}
    exact = next((r["digest"] for r in reps if _kind(r) == "fp16"), None)
    if per_step and exact is not None and not any(_kind(r) == "fp16" for r in kept):
        out["exact_digest"] = exact
    return out
