"""The simulator's view of a store profile: which of sakura's rungs a ``serving`` store holds, and the ladders a
client of such a store sees (``sakura bench e2e --mode sim --store-profile serving|full``).

The rungs kept are chosen by the store's own rule (:func:`sakura_core.precompute.store_profile.serving_rungs`) from
the measurements the simulated ladders are made of: single mode, each level's PSNR (the family's ``psnr_db``);
per-step, the cross-step measurement (``per_step_ladders.json``: each level's open-loop PSNR, its closed-loop twins'
PSNR and every step's bytes). A ladder slot the store does not hold is served by the nearest rung it does — the next
one up, else the next one down — under the slot's name, as the live client's
:func:`~sakura_core.policy.ladder.rungs_from_manifest` does; a closed-loop twin stays only where the store holds
it. So a policy asking for a missing rung gets the nearest held one, and every index (the floors) keeps its meaning.

Only sakura's family changes: CacheGen's ladder is its own template's, and the fetch-fp16 baseline reads the exact
fp16 of a ``full`` store (a ``serving`` store holds no fp16: the bench says so in its header and JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sakura_core.policy.ladder import Level
from sakura_core.precompute.store_profile import StoreProfile, serving_rungs

__all__ = ["HeldRungs", "held_per_step", "held_single", "serving_view"]


@dataclass(frozen=True)
class HeldRungs:
    """What a store of one profile holds of a template's sakura ladders.

    Attributes:
        profile: ``serving`` or ``full``.
        first: rung names held at step 0 (single mode: every shard); None: every rung (``full``).
        later: per-step mode, the open-loop rung names held at steps >= 1 (None: every rung).
        twins: per-step mode, the level names whose closed-loop twins are held at steps >= 1 (None: every twin).
    """

    profile: str
    first: frozenset[str] | None = None
    later: frozenset[str] | None = None
    twins: frozenset[str] | None = None

    def describe(self) -> str:
        """One line for the bench's header."""
        if self.profile == "full":
            return "store profile full: every rung, the exact fp16 included"
        out = f"store profile serving: sakura rungs held {_listed(self.first)}"
        if self.later is not None:
            out = (
                f"store profile serving: step 0 holds {_listed(self.first)}; steps >= 1 hold "
                f"open-loop {_listed(self.later)} and the twins of {_listed(self.twins)}"
            )
        return out + "; a policy asking for another rung gets the nearest held one"

    def as_dict(self) -> dict:
        def names(x):
            return None if x is None else sorted(x, key=_order)

        return {
            "profile": self.profile,
            "step0_or_single": names(self.first),
            "later_open_loop": names(self.later),
            "later_twins": names(self.twins),
        }


def _listed(names: frozenset[str] | None) -> str:
    """Rung names in ladder order for a header line: ``every`` for None (every rung), ``none`` for no rung."""
    return "every" if names is None else ", ".join(sorted(names, key=_order)) or "none"


def _order(name: str) -> tuple:
    stem, _, number = name.rpartition("-l")
    return (name == "fp16", int(number) if stem and number.isdigit() else -1, name)


def _kept(keep: dict[str, set[str]], kinds: tuple[str, ...]) -> frozenset[str]:
    return frozenset(n for k in kinds for n in keep.get(k, ())) | frozenset(keep["fp16"])


def held_single(levels: list[str], psnr_db: list[float], progressive: bool, profile: StoreProfile) -> HeldRungs:
    """The rungs a single-mode template of ``levels`` (cheapest first, ``fp16`` among them or not; ``psnr_db`` per
    level) keeps in ``profile``."""
    if profile.name == "full":
        return HeldRungs("full")
    own: dict[str, float | None] = {n: p for n, p in zip(levels, psnr_db, strict=True) if n != "fp16"}
    keep = serving_rungs(own, {}, {}, {}, profile, progressive)
    return HeldRungs("full") if keep is None else HeldRungs("serving", first=_kept(keep, ("own",)))


def held_per_step(data: dict, profile: StoreProfile) -> HeldRungs:
    """The rungs a per-step template measured as ``data`` (the ``per_step_ladders.json`` shape) keeps in
    ``profile``: step 0's chain, and at steps >= 1 the open-loop rungs and the twins."""
    if profile.name == "full":
        return HeldRungs("full")
    levels = [lv for lv in data["levels"] if lv["name"] != "fp16"]
    own = {lv["name"]: lv["psnr_db"] for lv in levels}
    twins = {lv["name"]: lv["closed"]["psnr_db"] for lv in levels if lv.get("closed")}
    later = range(1, data["steps"])
    cost: dict[tuple[str, str], float] = {}
    for lv in levels:
        cost[(lv["name"], "own")] = 1 / lv["increment_ratio"][0]
        cost[(lv["name"], "residual")] = sum(1 / lv["increment_ratio"][s] for s in later)
        if lv.get("closed"):
            cost[(lv["name"], "closed")] = sum(1 / lv["closed"]["ratio_vs_fp16"][s] for s in later)
    keep = serving_rungs(own, dict(own), twins, cost, profile, progressive=True)
    if keep is None:
        return HeldRungs("full")
    return HeldRungs(
        "serving", first=_kept(keep, ("own",)), later=_kept(keep, ("residual",)), twins=frozenset(keep["closed"])
    )


def _view(ladder: list[Level], names: frozenset[str] | None, twins: frozenset[str] | None) -> list[Level]:
    """``ladder`` as a store holding rungs ``names`` (None: every rung) and the twins of ``twins`` (None: every
    twin) serves it."""
    held = [j for j, lv in enumerate(ladder) if lv.reuse or names is None or lv.name in names]
    if not held:
        raise ValueError(
            f"a serving store holds none of the rungs {[lv.name for lv in ladder]} (held: {_listed(names)})"
        )
    out = []
    for j, lv in enumerate(ladder):
        closed = lv.closed if twins is None or lv.name in twins else None
        if j in held:
            out.append(lv.with_links(closed=closed))
        else:
            up = [k for k in held if k > j and not ladder[k].reuse]
            src = ladder[up[0] if up else max(k for k in held if not ladder[k].reuse)]
            # a stand-in upgrades nothing: fetching it costs its whole chain (as the live client's stand-ins)
            out.append(
                replace(src, name=lv.name, progressive=False, increment_bytes=src.nbytes).with_links(
                    closed=closed, off_track=lv.off_track
                )
            )
    return out


def serving_view(ladders: list[list[Level]], held: HeldRungs, layers: int, kv_mode: str) -> list[list[Level]]:
    """sakura's per-shard ladders (``g = step * layers + layer`` per-step) as a store holding ``held`` serves them."""
    if held.profile == "full":
        return ladders
    if kv_mode != "per-step":
        return [_view(lad, held.first, None) for lad in ladders]
    return [
        _view(lad, held.first, frozenset()) if g < layers else _view(lad, held.later, held.twins)
        for g, lad in enumerate(ladders)
    ]
