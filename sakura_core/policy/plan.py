"""What the runtime needs to fetch one template with one policy: the policy's view of the manifest's ladders and
the quality floor. Written once; the live pipeline, the phone simulation and the benchmarks all use it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property

from ..kv.manifest import Manifest
from .ladder import Level, Rung, levels_of, rungs_from_manifest, rungs_with_track_floor
from .policies import POLICIES, Policy, make_policy

__all__ = [
    "FLOOR_PSNR_DB",
    "FetchPlan",
    "floor_index",
    "plan_fetch",
    "policy_levels",
    "psnr_of",
    "runnable_policies",
    "track_floor_index",
    "track_psnr",
]

# A level is acceptable as the quality floor when its measured output PSNR (manifest ``psnr_db``) reaches this.
FLOOR_PSNR_DB = 35.0


def runnable_policies() -> list[str]:
    """Every policy that can run a real edit (the simulation-only bound with preloaded KV is left out)."""
    return [name for name, cls in POLICIES.items() if not (cls.kv_preloaded or cls.simulation_only)]


def floor_index(
    ladder_names: list[str], psnr_db: Mapping[str, float | None], floor_psnr_db: float = FLOOR_PSNR_DB
) -> int:
    """Index of the cheapest level whose measured output PSNR (``psnr_db[name]``, None or absent: not measured)
    reaches ``floor_psnr_db``; the last (exact) level when none qualifies. ``ladder_names`` is cheapest first."""
    for i, name in enumerate(ladder_names):
        psnr = psnr_db.get(name)
        if psnr is not None and psnr >= floor_psnr_db:
            return i
    return len(ladder_names) - 1


def policy_levels(names: list[str], family: str, psnr_db: dict[str, float] | None = None) -> list[int]:
    """Indices (into a ladder with level ``names``) that a policy of ``family`` may fetch: fp16 sees only the exact
    representation — from a store that does not hold it (``serving`` profile) the nearest one it does, its top rung:
    the level of highest ``psnr_db`` (per level name, on its twins' track) when given, else the last (the policy's
    decisions say so) —, CacheGen only its own levels (not the extra fp16 reference) while one of them reaches the
    quality floor (``psnr_db`` >= :data:`FLOOR_PSNR_DB`), else the fp16 too (held to sakura's floor: it fetches the
    exact level or computes), sakura everything."""
    if family == "fp16":
        if "fp16" in names:
            return [names.index("fp16")]
        rated = [(p, i) for i, n in enumerate(names) if (p := (psnr_db or {}).get(n)) is not None]
        return [max(rated)[1] if rated else len(names) - 1]
    if family == "cachegen":
        own = [i for i, n in enumerate(names) if n != "fp16"]
        own_db = [p for i in own if (p := (psnr_db or {}).get(names[i])) is not None]
        held = not own_db or max(own_db) >= FLOOR_PSNR_DB  # no PSNR measured: nothing to hold it to
        return own if held or "fp16" not in names else own + [names.index("fp16")]
    return list(range(len(names)))


@dataclass(frozen=True)
class FetchPlan:
    """The rungs the policy may fetch (per shard, cheapest first: each a level and the manifest entry the lanes fetch
    and decode for it) and the floor level for one policy.

    Attributes:
        policy: the policy.
        rungs: per shard (flat index) its ladder of :class:`~sakura_core.policy.ladder.Rung`.
        floor: the index of the cheapest level the policy may pick.
    """

    policy: Policy
    rungs: list[list[Rung]]
    floor: int

    @cached_property
    def ladders(self) -> list[list[Level]]:
        """The policies' view: per shard its levels (:func:`~sakura_core.policy.ladder.levels_of`)."""
        return levels_of(self.rungs)

    @property
    def floor_name(self) -> str:
        return self.rungs[0][self.floor].level.name


def plan_fetch(manifest: Manifest | dict, policy_name: str, decode_bytes_per_s: float = 6e8) -> FetchPlan:
    """Rungs for ``policy_name`` and the quality floor: the cheapest level whose measured output PSNR (manifest
    ``psnr_db``) reaches :data:`FLOOR_PSNR_DB` — on its closed-loop twins' track where a per-step template has them
    (the levels below the open-loop floor then fetch that floor off their track: ``Level.off_track``)."""
    policy = make_policy(policy_name)
    if policy.simulation_only:
        raise ValueError(
            f"policy {policy_name!r} is simulation-only (sakura bench e2e --mode sim); a real edit runs "
            f"one of {', '.join(runnable_policies())}"
        )
    rungs = rungs_from_manifest(manifest, decode_bytes_per_s)
    keep = policy_levels([r.level.name for r in rungs[0]], policy.family, track_psnr(rungs))
    rungs = [_kept_rungs(ladder, keep) for ladder in rungs]
    names = [r.level.name for r in rungs[0]]
    floor = floor_index(names, psnr_of(rungs[0]))
    track = track_floor_index(names, rungs)
    if track < floor:  # closed-loop twins reach the target lower: the floor on their track, the open one off it
        rungs, floor = rungs_with_track_floor(rungs, names[floor]), track
    return FetchPlan(policy, rungs, floor)


def psnr_of(ladder: list[Rung]) -> dict[str, float | None]:
    """Each rung's measured output PSNR (its representation's) by its representation's name (a ladder's, for
    :func:`floor_index`)."""
    return {r.rep.name: r.rep.psnr_db for r in ladder}


def _kept_rungs(ladder: list[Rung], keep: list[int]) -> list[Rung]:
    """The rungs at ``keep``; one whose representation's chain requires a representation left out carries the entries
    of its chain (``chain``: what the fetch lane sizes its blobs by; the top rung a fetch-fp16 policy gets from a
    store without fp16 is a progressive chain)."""
    out = []
    kept = {ladder[i].rep.digest for i in keep}
    by_digest = {r.rep.digest: r.rep for r in ladder}
    for i in keep:
        r = ladder[i]
        missing = tuple(by_digest[d] for d in r.rep.requires if d not in kept and d in by_digest)
        out.append(replace(r, rep=replace(r.rep, chain=missing)) if missing else r)
    return out


def track_floor_index(ladder_names: list[str], rungs: list[list[Rung]], floor_psnr_db: float = FLOOR_PSNR_DB) -> int:
    """Like :func:`floor_index`, on each level's track PSNR (:func:`track_psnr`)."""
    psnr = track_psnr(rungs)
    return floor_index(ladder_names, psnr, floor_psnr_db)


def track_psnr(rungs: list[list[Rung]]) -> dict[str, float]:
    """Per ladder slot name the measured PSNR of its track: its closed-loop twins' (``closed_twin``: step 0 at the
    level, every later step its twin) where the template has them, else the level's own ``psnr_db`` (a slot a
    ``serving`` store fills with another level, ``stands_for``, has only its twin's)."""
    own: dict[str, float] = {}
    twins: dict[str, float] = {}
    for ladder in rungs:
        for r in (rung.rep for rung in ladder):
            slot = r.slot_name
            twin = r.closed_twin
            if twin is not None and twin.psnr_db is not None:
                twins[slot] = twin.psnr_db
            if r.stands_for is None and r.psnr_db is not None:
                own.setdefault(slot, r.psnr_db)
    return {**own, **twins}
