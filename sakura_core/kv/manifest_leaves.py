"""The manifest's typed leaves: what :func:`~sakura_core.kv.manifest.parse_manifest` builds from the JSON once the
schema (:mod:`.manifest_schema`) and the bounds (:mod:`.manifest_limits`) hold — the schedule, blob references, the
reference images, and each shard with its representations and their cross-step references. Frozen; every reader
past the parse reads these, never the JSON (the wire format stays the manifest's own: :meth:`Manifest.to_json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BlobRef", "CrossStepRef", "Reference", "Representation", "Schedule", "Shard", "shard_from_json"]


@dataclass(frozen=True)
class Schedule:
    """The sampler schedule a per-step template's KV is valid for.

    Attributes:
        steps: sampler steps S.
        timesteps: the time (0..1) of each step, t_0 .. t_{S-1}.
        shift: the schedule's shift (> 0).
        guidance: guidance scale, or None.
        sampler: the sampler's name (``"flow-euler"``), or None.
    """

    steps: int
    timesteps: tuple[float, ...]
    shift: float
    guidance: float | None = None
    sampler: str | None = None

    @property
    def label(self) -> str:
        """``"4 steps, shift 1"``."""
        return f"{self.steps} steps, shift {self.shift:g}"


@dataclass(frozen=True)
class BlobRef:
    """A blob the manifest names besides the shards (the template image): its digest and size in bytes."""

    digest: str
    nbytes: int


@dataclass(frozen=True)
class Reference:
    """One reference image of a template (:mod:`sakura_core.models.ref_layout`).

    Attributes:
        token_grid: (rows, cols) of its tokens.
        rope_t: its RoPE time coordinate, ``10 (i + 1)`` for reference ``i``.
        token_offset: where its tokens start in the template's token sequence (and in every shard's K/V).
        tokens: rows * cols.
        name: a short name (``"person"``), or None.
        size: (S, S) pixels of the image the KV was computed from; None for a manifest without ``references``.
        image: its PNG as a blob (the device computes on-device layers from it); None before publishing.
    """

    token_grid: tuple[int, int]
    rope_t: int
    token_offset: int
    tokens: int
    name: str | None = None
    size: tuple[int, int] | None = None
    image: BlobRef | None = None

    def summary(self) -> dict:
        """What a report says of it: name, size, token grid, tokens (the ones known)."""
        out = {
            "name": self.name,
            "size": None if self.size is None else list(self.size),
            "token_grid": list(self.token_grid),
            "tokens": self.tokens,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class CrossStepRef:
    """A per-step representation's cross-step reference (:mod:`.manifest_refs`).

    Attributes:
        mode: ``"residual"`` (its blobs code KV_s - KV_r), ``"reuse"`` (no blob: the reference's KV) or ``"closed"``
            (a closed-loop twin coded against one representation of the reference shard).
        step: the reference shard's step r (< the shard's own step).
        digest: the fp16 digest of shard (r, same layers), or for ``closed`` the one representation it decodes
            against.
    """

    mode: str
    step: int
    digest: str

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"cross-step reference to step {self.step}: a step is >= 0")


@dataclass(frozen=True)
class Representation:
    """One representation of a shard (a rung of its ladder).

    Attributes:
        level: ascending level = ascending size and quality (>= 0).
        name: level name (``"sakura-l2"``, ``"fp16"``, a closed-loop twin ``"sakura-l2+cl"``).
        nbytes: this blob alone, bytes (0 only for a ``reuse`` representation, which has no blob).
        digest: sha256 hex of the blob (its name on the server); None for a ``reuse`` representation.
        requires: digests of the lower-level blobs this one refines, base first (empty for a base).
        codec: the blob's codec, or None (the manifest's).
        distortion: measured attention-output relative error of the decoded chain (0 = exact); None for ``reuse``.
        total_bytes: this blob plus every blob it requires, bytes, when the manifest states it.
        psnr_db: measured end-to-end PSNR of an edit with every shard at this level, dB, or None.
        ref: its cross-step reference (per-step manifests), or None for a self-contained representation.
    """

    level: int
    name: str
    nbytes: int
    digest: str | None
    requires: tuple[str, ...] = ()
    codec: str | None = None
    distortion: float | None = None
    total_bytes: int | None = None
    psnr_db: float | None = None
    ref: CrossStepRef | None = None

    def __post_init__(self) -> None:
        if self.level < 0 or self.nbytes < 0 or (self.digest is None) != (self.ref_mode == "reuse"):
            raise ValueError(
                f"representation {self.name!r}: level {self.level} and bytes {self.nbytes} must be >= 0, "
                "and only a reuse representation has no digest"
            )

    @property
    def ref_mode(self) -> str | None:
        """Its cross-step reference's mode, or None."""
        return None if self.ref is None else self.ref.mode

    @property
    def chain_digests(self) -> list[str]:
        """The blobs it decodes from, base first: ``requires + [digest]`` (empty for a ``reuse`` one)."""
        return [] if self.digest is None else [*self.requires, self.digest]


@dataclass(frozen=True)
class Shard:
    """One shard of a template: the KV of ``layers`` (at ``step`` for per-step KV) and its representations.

    Attributes:
        layers: (first, last) layers, inclusive.
        step: the sampler step (per-step manifests), None for single-mode KV.
        representations: ascending level.
        exact_digest: the fp16 digest when that blob is not stored (per-step serving profile), else None.
    """

    layers: tuple[int, int]
    step: int | None
    representations: tuple[Representation, ...]
    exact_digest: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.layers[0] <= self.layers[1] or not self.representations:
            raise ValueError(f"shard {self.layers}: layers must be 0 <= first <= last, with a representation")


def _representation_from_json(rep: dict) -> Representation:
    ref = rep.get("ref")
    dist, psnr = rep.get("distortion"), rep.get("psnr_db")
    return Representation(
        level=rep["level"],
        name=rep["name"],
        nbytes=rep["bytes"],
        digest=rep.get("digest"),
        requires=tuple(rep.get("requires") or ()),
        codec=rep.get("codec"),
        distortion=_number_or_none(dist),  # a reuse rung's is not checked by the schema (nothing decoded)
        total_bytes=rep.get("total_bytes"),
        psnr_db=_number_or_none(psnr),
        ref=None if ref is None else CrossStepRef(ref["mode"], ref["step"], ref["digest"]),
    )


def _number_or_none(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool), else None (a field the schema leaves unchecked)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def shard_from_json(shard: Any) -> Shard:
    """The typed shard of a JSON shard entry the schema has checked (:func:`~.manifest_schema.check_shards`)."""
    first, last = shard["layers"]
    reps = tuple(_representation_from_json(r) for r in shard["representations"])
    return Shard((first, last), shard.get("step"), reps, shard.get("exact_digest"))
