"""The ladder model the policies reason about: one :class:`Level` per representation of a shard, built from a
manifest (live) or from codec measurements (simulation)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..kv.manifest import Manifest, Representation, as_manifest
from ..kv.manifest_schema import CLOSED_REF_MODE
from ..kv.names import base_level_name

__all__ = [
    "CrossStepLinks",
    "Level",
    "PlannedRep",
    "Rung",
    "feeds_twin",
    "fetch_as",
    "levels_from",
    "levels_of",
    "rungs_from_manifest",
    "rungs_with_track_floor",
    "self_contained_top",
    "shard_floor",
    "twin_applies",
    "with_track_floor",
]


@dataclass(frozen=True)
class CrossStepLinks:
    """A level's links to other steps and levels (a part of :class:`Level`; the default: none, a self-contained
    level).

    Attributes:
        ref_step: a cross-step residual's reference: the step whose same layer must be decoded (or computed on the
            device) before this level decodes; ``None`` for a self-contained level.
        reuse: the zero-byte ``reuse`` rung of a cross-step template: nothing is fetched or decoded, the KV is the
            reference's (``ref_step``, same layer) as the device holds it (``nbytes`` 0; needs ``ref_step``).
        closed: the level's closed-loop twin (cross-step templates, steps >= 1): fetched instead of this level when
            the device holds the reference shard (``ref_step``, same layer) at this level's track — the same level
            there, and for a step >= 1 reference its twin (:func:`twin_applies`); its own bytes, decode time
            and MSE share. ``None``: no twin.
        off_track: the ladder index fetched instead of this level when its twin does not apply, because this
            level's own (open-loop) quality is below the floor's target (the floor is chosen on the twins' track):
            the open-loop floor. ``None``: this level itself serves either way (:func:`fetch_as`).
    """

    ref_step: int | None = None
    reuse: bool = False
    closed: Level | None = None
    off_track: int | None = None


@dataclass(frozen=True)
class Level:
    """One representation of a shard. The links' fields read flat too (``lv.ref_step``, ``lv.closed``: read-only
    views of ``links``); :meth:`with_links` sets them.

    Attributes:
        name: level name (e.g. "s2", "fp16").
        nbytes: bytes to fetch for this level from nothing (base + all enhancements up to it).
        increment_bytes: bytes beyond the previous level when ``progressive`` (else == nbytes).
        decode_s: seconds to decode this level (whole chain).
        mse: output MSE (images in [-1, 1]) if every layer used this level, divided by the layer count.
        progressive: refines the previous level (an upgrade fetches only ``increment_bytes``).
        links: its cross-step reference, ``reuse`` flag, closed-loop twin and open-loop floor
            (:class:`CrossStepLinks`).
    """

    name: str
    nbytes: int
    increment_bytes: int
    decode_s: float
    mse: float
    progressive: bool = False
    links: CrossStepLinks = CrossStepLinks()

    @property
    def ref_step(self) -> int | None:
        return self.links.ref_step

    @property
    def reuse(self) -> bool:
        return self.links.reuse

    @property
    def closed(self) -> Level | None:
        return self.links.closed

    @property
    def off_track(self) -> int | None:
        return self.links.off_track

    def with_links(self, **changes: Any) -> Level:
        """This level with the :class:`CrossStepLinks` fields ``changes`` set (``lv.with_links(off_track=3)``)."""
        return replace(self, links=replace(self.links, **changes))

    @property
    def expected_nbytes(self) -> int:
        """What a fetch of this level is planned at: its closed-loop twin's bytes when the level is below the
        open-loop floor (``off_track`` set: the floor was chosen on the twins' track, where it is fetched as the
        twin), else its own."""
        return self.closed.nbytes if (self.closed is not None and self.off_track is not None) else self.nbytes

    def fetched(self, twin: bool) -> Level:
        """What a fetch of this level brings: its closed-loop twin when ``twin`` (:func:`fetch_as` said so), else
        the level itself."""
        if not twin:
            return self
        if self.closed is None:
            raise ValueError(f"level {self.name}: fetched as its closed-loop twin, but it has none (closed=None)")
        return self.closed

    def __post_init__(self) -> None:
        if self.reuse and (self.ref_step is None or self.nbytes != 0):
            raise ValueError(
                f"level {self.name}: a reuse rung fetches nothing (nbytes 0, got {self.nbytes}) and names "
                f"the step it reuses (ref_step, got {self.ref_step})"
            )


@dataclass(frozen=True)
class PlannedRep(Representation):
    """A shard's representation as a ladder slot serves it (what the lanes fetch and decode): the manifest's entry
    plus what the plan adds.

    Attributes:
        stands_for: the slot's level name when a ``serving`` store lacks that level for this shard and this (nearest)
            representation serves it; None: it is the slot's own level.
        closed_twin: the level's closed-loop twin (fetched in its place on its track), or None.
        chain: the entries of its ``requires`` that the policy's ladder left out (what the fetch lane sizes those
            blobs by; a fetch-fp16 policy's top rung from a store without fp16 is a progressive chain).
    """

    stands_for: str | None = None
    closed_twin: Representation | None = None
    chain: tuple[Representation, ...] = ()

    @classmethod
    def of(cls, rep: Representation, **plan) -> PlannedRep:
        """``rep`` (a manifest entry, or a planned one) with the plan's fields ``plan`` set."""
        return cls(**{**{f.name: getattr(rep, f.name) for f in fields(rep)}, **plan})

    @property
    def slot_name(self) -> str:
        """The ladder slot it serves: ``stands_for``, else its own name."""
        return self.name if self.stands_for is None else self.stands_for


@dataclass(frozen=True)
class Rung:
    """One rung of a shard's ladder as a plan serves it: the :class:`Level` the policies reason about and the
    :class:`PlannedRep` (its manifest entry) the lanes fetch and decode for it."""

    level: Level
    rep: PlannedRep


def levels_of(rungs: list[list[Rung]]) -> list[list[Level]]:
    """The policies' view of per-shard ``rungs``: each shard's levels, in the same order."""
    return [[r.level for r in ladder] for ladder in rungs]


def twin_applies(level: Level, ref_held: tuple[str, bool] | None) -> bool:
    """Whether ``level`` of a shard is fetched as its closed-loop twin: it has one, and the device holds its reference
    shard as ``ref_held`` = (the name of the level held, whether that was the twin) at the same level — the twin
    itself for a step >= 1 reference, the level itself at step 0 (the tracks' root: ``ref_step`` 0). Names, not
    indices: a ladder with a ``reuse`` rung in front is shifted by one."""
    if level.closed is None or ref_held is None:
        return False
    held_name, held_twin = ref_held
    return held_name == level.name and (held_twin or level.ref_step == 0)


def feeds_twin(ladder: list[Level], level: int, next_ladder: list[Level]) -> bool:
    """A shard held at ``ladder[level]`` is what the next step's same layer (``next_ladder``) decodes its closed-loop
    twin of that level against: an upgrade of it would take that layer off its track (the next step then fetches
    the open-loop floor)."""
    name = ladder[level].name
    return any(lv.name == name and lv.closed is not None for lv in next_ladder)


def fetch_as(ladder: list[Level], index: int, on_track: bool) -> tuple[int, bool]:
    """What a choice of level ``index`` fetches: (ladder index, as its closed-loop twin?). On the level's track
    (:func:`twin_applies`, or the live HeldKV.closed_twin) the twin serves when the level's own quality is below the
    floor's target or the twin is no larger; off it, a level below that target is fetched at its ``off_track``
    index (the open-loop floor) instead."""
    lv = ladder[index]
    if lv.closed is None:
        return index, False
    if on_track and (lv.off_track is not None or lv.closed.nbytes <= lv.nbytes):
        return index, True
    return (index if lv.off_track is None else lv.off_track), False


def fetch_bytes(ladder: list[Level], index: int, on_track: bool) -> int:
    """The bytes a choice of level ``index`` fetches on or off its twins' track (:func:`fetch_as`)."""
    j, twin = fetch_as(ladder, index, on_track)
    return ladder[j].fetched(twin).nbytes


def fewest_fetch_bytes(ladder: list[Level], floor: int) -> int:
    """The fewest bytes a fetch of shard ``ladder`` at its quality floor ``floor`` or above can cost, on its twins'
    track or off it (:func:`fetch_bytes`: a level below the open-loop floor comes as its twin or as that floor, never
    as itself); a ``reuse`` rung costs nothing."""
    return min(fetch_bytes(ladder, j, on) for j in levels_from(ladder, floor) for on in (True, False))


def with_track_floor(ladders: list[list[Level]], open_floor: str) -> list[list[Level]]:
    """``ladders`` with ``off_track`` = the index of level ``open_floor`` (the cheapest whose own quality reaches the
    target) on every level with a twin below it: what :func:`fetch_as` reads when the floor is chosen on the twins'
    track (lower than ``open_floor``)."""
    out = []
    for lad in ladders:
        at = next(j for j, lv in enumerate(lad) if lv.name == open_floor)
        out.append([_off_track(lv, j, at) for j, lv in enumerate(lad)])
    return out


def rungs_with_track_floor(rungs: list[list[Rung]], open_floor: str) -> list[list[Rung]]:
    """:func:`with_track_floor` on the levels of per-shard ``rungs`` (their manifest entries unchanged)."""
    out = []
    for lad in rungs:
        at = next(j for j, r in enumerate(lad) if r.level.name == open_floor)
        out.append([replace(r, level=_off_track(r.level, j, at)) for j, r in enumerate(lad)])
    return out


def _off_track(lv: Level, j: int, at: int) -> Level:
    """Level ``lv`` (at ladder index ``j``) fetched off its twins' track at index ``at`` when it has a twin below
    ``at``; else as it is."""
    return lv.with_links(off_track=at) if lv.closed is not None and j < at else lv


def shard_floor(floor, g: int) -> int:
    """The quality floor of shard ``g``: ``floor`` is one index for every ladder, or one per shard (a cross-step
    family whose later steps start with an eligible ``reuse`` rung: their floor is that rung)."""
    return floor if isinstance(floor, int) else int(floor[g])


def self_contained_top(ladder: list[Rung]) -> int | None:
    """The index of a shard's top rung (``ladder``) when its representation decodes without a reference (the fp16 a
    full store keeps), else None: a ``serving`` store keeps no self-contained level at a cross-step step."""
    return len(ladder) - 1 if ladder[-1].rep.ref is None else None


def levels_from(ladder: list[Level], floor: int) -> list[int]:
    """The indices of ``ladder`` a policy may pick with its quality floor at ``floor``: the floor and every level above
    it; above a ``reuse`` rung only those no worse than it (such a ladder is not ordered by quality: a fetched level
    cheaper than the floor the rung replaced may be worse than the rung)."""
    if not ladder[floor].reuse:
        return list(range(floor, len(ladder)))
    return [j for j in range(floor, len(ladder)) if j == floor or ladder[j].mse <= ladder[floor].mse]


def rungs_from_manifest(
    manifest: Manifest | dict, decode_bytes_per_s: float, level_psnr_db: dict[str, float] | None = None
) -> list[list[Rung]]:
    """Per-shard ladders (cheapest first) of rungs: each a level for the policies with its manifest representation
    (:func:`levels_of`: the policies' view).

    Single mode: one ladder per layer. Per-step mode (the per-step shard protocol of
    :mod:`sakura_core.policy.context`): one per (step, layer), at index ``g = step * L + layer`` — never a step's KV
    in another step's slot. ``level_psnr_db`` maps a level name to the output PSNR measured with every shard at that
    level (default: the manifest's ``psnr_db``); without either, the manifest's distortion orders the levels.
    """
    m = as_manifest(manifest)
    L = m.num_layers
    per_step = m.kv_mode == "per-step"
    steps = m.schedule.steps if m.schedule is not None else 1
    n = steps * L  # a level's output MSE is shared out over every shard
    ladders: list[list[Rung] | None] = [None] * n
    slots = _slot_names(m.shards)
    rows, cols = m.token_grid
    for shard in m.shards:
        first, last = shard.layers
        g = (shard.step or 0) * L + first if per_step else first
        if first != last:
            raise ValueError(f"the live runtime fetches one layer per shard; shard {first}-{last} groups layers")
        # what every level decodes to: K and V of this shard's layers in fp16, whatever the level's size on the wire
        fp16_bytes = (last - first + 1) * 2 * rows * cols * m.heads * m.head_dim * 2
        rungs = _shard_ladder(shard.representations, slots, fp16_bytes / decode_bytes_per_s, n, level_psnr_db)
        if ladders[g] is not None:
            raise ValueError(f"manifest has two shards for {_slot(g, L, per_step)}")
        ladders[g] = rungs
    missing = [g for g, x in enumerate(ladders) if x is None]
    if missing and not per_step:
        raise ValueError(f"manifest lacks shards for layers {missing}")
    if missing:
        raise ValueError(f"manifest lacks shards for {', '.join(_slot(g, L, True) for g in missing)}")
    return [x for x in ladders if x is not None]  # none missing: every slot


def _mse(rep: Representation, n: int, level_psnr_db: dict[str, float] | None) -> float:
    """A level's output MSE share per shard: from its PSNR (measured, else the manifest's), else its distortion."""
    psnr = (level_psnr_db or {}).get(rep.name, rep.psnr_db)
    return 4 * 10 ** (-psnr / 10) / n if psnr is not None else float(rep.distortion or 0.0) ** 2 / n


def _shard_ladder(representations, slots: list[str], decode_s: float, n: int, level_psnr_db) -> list[Rung]:
    """One shard's rungs: its levels and their planned representations. A zero-byte ``reuse`` rung (cross-step templates) is not
    a fetchable level: it is not in the index ladder; a closed-loop twin goes with its level (``Level.closed``, the
    representation's ``closed_twin``)."""
    twins = {base_level_name(r.name): r for r in representations if r.ref_mode == CLOSED_REF_MODE}
    own = [PlannedRep.of(r) for r in representations if r.ref_mode not in ("reuse", CLOSED_REF_MODE)]
    own = sorted(own, key=lambda r: (r.name == "fp16", r.level))
    reps = _fill_slots(own, slots)
    by_digest = {r.digest: r for r in reps}
    rungs, prev_bytes = [], 0
    for r in reps:
        chain_bytes = sum(by_digest[d].nbytes for d in r.requires if d in by_digest) + r.nbytes
        progressive = bool(r.requires)
        level = Level(
            name=r.slot_name,
            nbytes=chain_bytes,
            increment_bytes=r.nbytes if progressive else chain_bytes,
            decode_s=decode_s,
            mse=_mse(r, n, level_psnr_db),
            progressive=progressive and chain_bytes > prev_bytes,
            links=CrossStepLinks(ref_step=None if r.ref is None else r.ref.step),
        )
        rungs.append(Rung(level, r))
        prev_bytes = chain_bytes
    return _with_twins(rungs, twins, decode_s, n, level_psnr_db)


def _name_key(name: str) -> tuple:
    """A level name's place in a ladder: the codec's level number (``sakura-l3`` -> 3), the exact fp16 last."""
    stem, _, number = name.rpartition("-l")
    return (name == "fp16", int(number) if stem and number.isdigit() else -1, name)


def _slot_names(shards) -> list[str]:
    """Every level name some shard offers as a rung (not ``reuse``, not a twin), in ladder order: the slots of every
    shard's ladder. A full store offers the same names in every shard; a ``serving`` one a subset per shard."""
    names = {r.name for sh in shards for r in sh.representations if r.ref_mode not in ("reuse", CLOSED_REF_MODE)}
    return sorted(names, key=_name_key)


def _fill_slots(reps: list[PlannedRep], slots: list[str]) -> list[PlannedRep]:
    """One representation per slot: a level the store does not hold for this shard (``serving`` profile) is served by
    the nearest one it does — the next one up, else the next one down — marked ``stands_for`` the slot's name; the
    slot keeps its own closed-loop twin where the store holds one (a twin of another level never applies: its track
    starts at step 0's level of its own name)."""
    have = {r.name: r for r in reps}
    if list(have) == slots:
        return reps
    out = []
    for i, name in enumerate(slots):
        if name in have:
            out.append(have[name])
            continue
        near = [slots[j] for j in [*range(i + 1, len(slots)), *range(i - 1, -1, -1)] if slots[j] in have]
        out.append(replace(have[near[0]], stands_for=name))
    return out


def _with_twins(rungs: list[Rung], twins: dict[str, Representation], decode_s: float, n: int, level_psnr_db):
    """``rungs`` with each level's closed-loop twin as ``Level.closed``, and its representation carrying the twin's
    manifest entry (``closed_twin``): what the fetch lane substitutes."""
    if not twins:
        return rungs
    out = []
    for rung in rungs:
        twin = twins.get(rung.level.name)
        if twin is not None:
            assert twin.ref is not None  # a closed-loop twin (CLOSED_REF_MODE)
            mse = _mse(twin, n, level_psnr_db)
            links = CrossStepLinks(ref_step=twin.ref.step)
            closed = Level(twin.name, twin.nbytes, twin.nbytes, decode_s, mse, links=links)
            rung = Rung(rung.level.with_links(closed=closed), replace(rung.rep, closed_twin=twin))
        out.append(rung)
    return out


def _slot(g: int, L: int, per_step: bool) -> str:
    return f"step {g // L} layer {g % L}" if per_step else f"layer {g}"
