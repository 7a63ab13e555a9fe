"""Binding of a shard to the slot a manifest puts it in: the blob's own header must name the same template, model,
layers, step, reference and level as the manifest entry it was fetched for.

A digest only proves that the bytes are the ones the manifest names, not that the manifest named the right ones: a
tampered or mixed-up manifest (two layers' digests swapped, a layer pointing at another template's shard) would
otherwise decode into a silently wrong edit. :func:`check_shard_binding` is a pure check of a decoded
:class:`~sakura_core.kv.container.ShardHeader` against the expected :class:`ShardSlot`; a mismatch raises
:class:`ShardBindingError`, a :class:`~sakura_core.kv.container.ShardCorruptError`, so callers treat the shard as
corrupt (fall back) and say why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .codec_registry import get_codec
from .container import ShardCorruptError, ShardHeader
from .manifest_schema import DECODED_REF_MODES
from .names import base_level_name

if TYPE_CHECKING:
    from .manifest import Manifest, Representation

__all__ = ["ShardBindingError", "ShardSlot", "check_shard_binding", "check_shard_geometry", "slot_from_manifest"]


class ShardBindingError(ShardCorruptError):
    """A shard's header names another template, model, layer range or level than the slot it was fetched for."""


@dataclass(frozen=True)
class ShardSlot:
    """What a manifest says a representation is.

    Attributes:
        template_id: the template the manifest is for.
        model_id: the model the manifest is for.
        layers: (first, last) layers of the manifest's shard entry, inclusive.
        codec: the representation's codec name.
        level_name: the representation's level name (``codec.level_name(header.level)`` of its top blob).
        token_grid, heads, head_dim: the manifest's KV geometry (None: not checked), compared with every blob's
            header before it is decompressed (:func:`check_shard_geometry`).
        step: the shard entry's sampler step (per-step manifests), ``None`` for single-mode KV.
        reference: ``(step, base digest)`` a cross-step residual is coded against, ``None`` for a self-contained one.
    """

    template_id: str
    model_id: str
    layers: tuple[int, int]
    codec: str
    level_name: str
    token_grid: tuple[int, int] | None = None
    heads: int | None = None
    head_dim: int | None = None
    step: int | None = None
    reference: tuple[int, str] | None = None

    def __post_init__(self) -> None:
        first, last = self.layers
        if not 0 <= first <= last:
            raise ValueError(f"ShardSlot.layers must be (first, last) with 0 <= first <= last, got {self.layers}")


def slot_from_manifest(manifest: Manifest, layer: int, rep: Representation, step: int | None = None) -> ShardSlot:
    """The slot of representation ``rep`` in the manifest shard entry that holds ``layer`` (at ``step``: per-step
    manifests key their shards by (step, layers); ``None`` for a single-mode manifest)."""
    for shard in manifest.shards:
        first, last = shard.layers
        if first <= layer <= last and shard.step == step:
            codec = rep.codec or manifest.codec
            ref = rep.ref
            reference = (ref.step, ref.digest) if ref is not None and ref.mode in DECODED_REF_MODES else None
            # a closed-loop twin's blob is its level's (the reference it names tells it from the open-loop one)
            return ShardSlot(
                manifest.template_id,
                manifest.model_id,
                (first, last),
                codec,
                base_level_name(rep.name),
                token_grid=manifest.token_grid,
                heads=manifest.heads,
                head_dim=manifest.head_dim,
                step=step,
                reference=reference,
            )
    at = "" if step is None else f" at step {step}"
    raise ValueError(f"manifest of template {manifest.template_id!r} has no shard holding layer {layer}{at}")


def check_shard_geometry(header: ShardHeader, slot: ShardSlot) -> None:
    """Raise :class:`ShardBindingError` unless ``header`` (any blob of the slot's chain, its level aside) names the
    slot's template, model, layers, codec and geometry: run on each blob's header before it is decompressed, so a
    small blob claiming another grid is refused before its size is allocated."""
    problems = _identity_problems(header, slot)
    if header.codec != slot.codec:
        problems.append(f"codec {header.codec!r} (expected {slot.codec!r})")
    _raise_if(problems)


def _identity_problems(header: ShardHeader, slot: ShardSlot) -> list[str]:
    problems = []
    if header.template_id != slot.template_id:
        problems.append(f"template {header.template_id!r} (expected {slot.template_id!r})")
    if header.model_id != slot.model_id:
        problems.append(f"model {header.model_id[:12]}… (expected {slot.model_id[:12]}…)")
    if (header.layer_first, header.layer_last) != tuple(slot.layers):
        problems.append(
            f"layers {header.layer_first}-{header.layer_last} (expected {slot.layers[0]}-{slot.layers[1]})"
        )
    if slot.token_grid is not None and tuple(header.token_grid) != tuple(slot.token_grid):
        problems.append(f"token grid {list(header.token_grid)} (expected {list(slot.token_grid)})")
    if slot.heads is not None and header.heads != slot.heads:
        problems.append(f"heads {header.heads} (expected {slot.heads})")
    if slot.head_dim is not None and header.head_dim != slot.head_dim:
        problems.append(f"head_dim {header.head_dim} (expected {slot.head_dim})")
    return problems


def check_shard_binding(header: ShardHeader, slot: ShardSlot) -> None:
    """Raise :class:`ShardBindingError` naming every field where ``header`` (the chain's top blob) disagrees with
    ``slot``, its level included."""
    problems = _identity_problems(header, slot)
    if header.step != slot.step:
        problems.append(f"step {header.step} (expected {slot.step})")
    if header.reference != slot.reference:
        problems.append(f"reference {_ref(header.reference)} (expected {_ref(slot.reference)})")
    if header.codec != slot.codec:
        problems.append(f"codec {header.codec!r} (expected {slot.codec!r})")
    else:
        name = get_codec(header.codec).level_name(header.level)
        if name != slot.level_name:
            problems.append(f"level {name!r} (expected {slot.level_name!r})")
    _raise_if(problems)


def _raise_if(problems: list[str]) -> None:
    if problems:
        raise ShardBindingError(
            "shard does not belong where the manifest puts it: its header says "
            + ", ".join(problems)
            + "; the manifest is tampered with or mixed up — treating the shard as corrupt"
        )


def _ref(ref: tuple[int, str] | None) -> str:
    return "none" if ref is None else f"step {ref[0]} base {ref[1][:12]}…"
