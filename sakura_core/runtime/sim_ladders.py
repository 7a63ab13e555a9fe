"""How a geometry's ladders are given to the simulator: :class:`ShardLadders`, one ladder per shard per codec family.

The simulator (:func:`~sakura_core.runtime.simulate.simulate`) takes ``ladders[family][g]`` = shard ``g``'s levels
(cheapest first, :class:`~sakura_core.policy.ladder.Level`) and ``floors[family]`` = the index of the quality floor
in every ladder of that family. Shards are indexed ``g = step * L + layer`` in per-step KV mode (``steps x L``
shards) and ``g = layer`` in single mode (``L`` shards). :class:`ShardLadders` is that input with its units, its
provenance and a JSON form (``sakura bench e2e --ladders FILE``), so a measurement made elsewhere (e.g. cross-step
ladders) plugs in without touching the simulator.

Per family, per shard ``g`` and level ``j`` (the same level names, cheapest first, for every shard):

* ``bytes[g][j]``: bytes to fetch level ``j`` of shard ``g`` from nothing (its whole chain);
* ``increment_bytes[g][j]``: bytes an upgrade from level ``j - 1`` fetches (== ``bytes`` for a level that is not
  ``progressive``);
* ``decode_s[g][j]``: seconds to decode level ``j``'s whole chain on the device (an upgrade costs the difference);
* ``mse[g][j]``: shard ``g``'s additive share of the edit's output MSE (images in [-1, 1]) when it is used at level
  ``j``: summed over every shard at level ``j`` it is the output MSE of the edit with every shard at ``j``;
* ``reference[g][j]``: the shard whose decoded KV level ``j`` of shard ``g`` is coded against (cross-step coding), or
  ``None`` for a level that decodes on its own. The simulator records it; a rule that a referencing shard waits for
  its reference belongs with the cross-step codec (issue 24).

``floor`` is the family's quality floor: the cheapest level whose edit PSNR with every shard at it reaches the
target (``psnr_db[j]``, measured).

CacheGen is held to the same floor as sakura (:func:`held_to_floor`): when none of its levels reaches the target (its
best per-step level gives 29.2 dB), the simulator's ``cachegen`` ladder gains the exact level as its top rung and
floor, so its rule fetches fp16 or recomputes. The family as measured (its best level as the floor, under the
target) is kept as ``cachegen-no-floor``, the old behaviour, reported once beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics import psnr_from_mse
from ..policy.ladder import Level
from ..policy.plan import FLOOR_PSNR_DB

__all__ = ["CACHEGEN_NO_FLOOR", "FORMAT", "FamilyLadders", "ShardLadders", "held_to_floor"]

#: The ladder family of CacheGen as measured, its floor under the target when no level reaches it (the old rule).
CACHEGEN_NO_FLOOR = "cachegen-no-floor"

FORMAT = "sakura-sim-ladders"
_VERSION = 1
_PER_SHARD = ("bytes", "increment_bytes", "decode_s", "mse")


@dataclass(frozen=True)
class FamilyLadders:
    """One codec family's ladders (see the module docstring for every field's unit)."""

    levels: tuple[str, ...]
    progressive: tuple[bool, ...]
    floor: int
    bytes: tuple[tuple[int, ...], ...]
    increment_bytes: tuple[tuple[int, ...], ...]
    decode_s: tuple[tuple[float, ...], ...]
    mse: tuple[tuple[float, ...], ...]
    reference: tuple[tuple[int | None, ...], ...] | None = None

    def __post_init__(self) -> None:
        n, m = len(self.bytes), len(self.levels)
        if m == 0 or len(self.progressive) != m or not 0 <= self.floor < m:
            raise ValueError(
                f"a family needs >= 1 level, one progressive flag per level and a floor in 0..{m - 1}; "
                f"got {m} levels, {len(self.progressive)} flags, floor {self.floor}"
            )
        for name in _PER_SHARD + (("reference",) if self.reference is not None else ()):
            rows = getattr(self, name)
            if len(rows) != n or any(len(r) != m for r in rows):
                raise ValueError(f"{name} must have one row of {m} values (one per level) for each of the {n} shards")
        for g, row in enumerate(self.bytes):
            if any(b <= 0 for b in row):
                raise ValueError(f"shard {g}: every level's bytes must be > 0, got {list(row)}")

    @property
    def shards(self) -> int:
        return len(self.bytes)

    def psnr_db(self) -> list[float]:
        """Per level: the edit's output PSNR with every shard at that level (from the additive MSE shares)."""
        return [psnr_from_mse(sum(row[j] for row in self.mse)) for j in range(len(self.levels))]

    def to_levels(self) -> list[list[Level]]:
        """``ladders[g]`` for the simulator."""
        out = []
        for g in range(self.shards):
            out.append(
                [
                    Level(
                        name,
                        int(self.bytes[g][j]),
                        int(self.increment_bytes[g][j]),
                        float(self.decode_s[g][j]),
                        float(self.mse[g][j]),
                        bool(self.progressive[j]),
                    )
                    for j, name in enumerate(self.levels)
                ]
            )
        return out

    def as_dict(self) -> dict:
        out = {"levels": list(self.levels), "progressive": list(self.progressive), "floor": self.floor}
        for name in _PER_SHARD:
            out[name] = [list(r) for r in getattr(self, name)]
        if self.reference is not None:
            out["reference"] = [list(r) for r in self.reference]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> FamilyLadders:
        try:
            rows = {name: tuple(tuple(r) for r in d[name]) for name in _PER_SHARD}
            ref = d.get("reference")
            return cls(
                tuple(d["levels"]),
                tuple(bool(x) for x in d["progressive"]),
                int(d["floor"]),
                reference=None if ref is None else tuple(tuple(r) for r in ref),
                **rows,
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"a ladder family needs levels, progressive, floor, {', '.join(_PER_SHARD)}: {e}") from e


@dataclass(frozen=True)
class ShardLadders:
    """Every family's per-shard ladders for one geometry and KV mode, and where they come from.

    Attributes:
        geometry: the geometry's name (``--geometry``); kv_mode: ``single`` or ``per-step``.
        layers, steps: the geometry's layers per step and denoising steps (shards: ``layers`` in single mode,
            ``steps * layers`` per step).
        families: family name (``sakura``, ``cachegen``, ``fp16``) -> its ladders.
        source: how the numbers were measured (free-form JSON: commands, sizes, methods).
    """

    geometry: str
    kv_mode: str
    layers: int
    steps: int
    families: dict[str, FamilyLadders]
    source: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        want = self.layers * (self.steps if self.kv_mode == "per-step" else 1)
        if self.kv_mode not in ("single", "per-step"):
            raise ValueError(f"kv_mode must be single or per-step, got {self.kv_mode!r}")
        for name, fam in self.families.items():
            if fam.shards != want:
                raise ValueError(
                    f"{self.geometry} {self.kv_mode}: family {name} has {fam.shards} shards, the geometry "
                    f"needs {want} ({self.layers} layers x {self.steps if want > self.layers else 1})"
                )

    def for_simulator(
        self, floor_psnr_db: float = FLOOR_PSNR_DB
    ) -> tuple[dict[str, list[list[Level]]], dict[str, int]]:
        """(ladders, floors) as :func:`~sakura_core.runtime.simulate.simulate` takes them; ``cachegen`` held to
        ``floor_psnr_db`` (:func:`held_to_floor`, with the fp16 family's level), the family as measured beside it as
        :data:`CACHEGEN_NO_FLOOR`."""
        fams = dict(self.families)
        if "cachegen" in fams and "fp16" in fams:
            fams[CACHEGEN_NO_FLOOR] = fams["cachegen"]
            fams["cachegen"] = held_to_floor(fams["cachegen"], fams["fp16"], floor_psnr_db)
        return {n: f.to_levels() for n, f in fams.items()}, {n: f.floor for n, f in fams.items()}

    def as_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": _VERSION,
            "geometry": self.geometry,
            "kv_mode": self.kv_mode,
            "layers": self.layers,
            "steps": self.steps,
            "source": self.source,
            "families": {n: f.as_dict() for n, f in self.families.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> ShardLadders:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file (format {d.get('format')!r}); write one with ShardLadders.as_dict")
        if d.get("version") != _VERSION:
            raise ValueError(f"{FORMAT} version {d.get('version')!r} is not supported (this code reads {_VERSION})")
        fams = {n: FamilyLadders.from_dict(f) for n, f in d["families"].items()}
        return cls(d["geometry"], d["kv_mode"], int(d["layers"]), int(d["steps"]), fams, d.get("source", {}))


def held_to_floor(fam: FamilyLadders, exact: FamilyLadders, floor_psnr_db: float = FLOOR_PSNR_DB) -> FamilyLadders:
    """``fam`` held to the quality floor ``floor_psnr_db`` (dB): unchanged when its floor level's edit PSNR reaches it;
    else ``exact``'s top level (fp16: one level, the same shards) appended to every shard's ladder as its top rung and
    its floor, so no level under the target is selectable (a policy then fetches the exact level or computes)."""
    if fam.psnr_db()[fam.floor] >= floor_psnr_db:
        return fam
    if exact.shards != fam.shards:
        raise ValueError(f"held_to_floor: the exact family has {exact.shards} shards, {fam.shards} needed")
    top = len(exact.levels) - 1
    name = exact.levels[top]
    if name in fam.levels:
        raise ValueError(f"held_to_floor: level {name!r} is already in the family's ladder {list(fam.levels)}")

    def plus(rows, extra):
        return tuple(tuple(row) + (x[top],) for row, x in zip(rows, extra, strict=True))

    ref = None if fam.reference is None else tuple(tuple(r) + (None,) for r in fam.reference)
    return FamilyLadders(
        fam.levels + (name,),
        fam.progressive + (False,),
        len(fam.levels),
        plus(fam.bytes, exact.bytes),
        plus(fam.increment_bytes, exact.bytes),
        plus(fam.decode_s, exact.decode_s),
        plus(fam.mse, exact.mse),
        ref,
    )
