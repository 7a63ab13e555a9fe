"""Whole-template helpers over the codec registry: split a template's KV into shard inputs, encode every shard at a
level, and decode per-shard chains back into one KV tensor (what precompute, the benchmarks and the tests use)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from ..models.kv_types import PerStepTemplateKV, TemplateKV
from .chain import DecodedReference, decode_chain
from .codec_registry import ShardInput, ShardMeta, get_codec
from .names import base_level_name

__all__ = [
    "ImportanceWeights",
    "decode_kv",
    "decode_per_step",
    "decode_template",
    "encode_kv",
    "level_chains",
    "shard_inputs",
]


class ImportanceWeights(Protocol):
    """What the encoders weigh bits by (``sakura_core.precompute.importance.TokenImportance`` is one)."""

    k_weight: np.ndarray  # (layers, tokens, heads, head_dim)
    v_weight: np.ndarray  # (layers, tokens, heads)
    k_drop: np.ndarray  # (layers, tokens, heads)

    def layer_scale(self) -> np.ndarray:
        """(layers,) factor on each layer's weights (layers in the same units for a template-wide allocation)."""


def shard_inputs(
    kv: TemplateKV,
    template_id: str,
    importance: ImportanceWeights | None = None,
    shard_layers: int = 1,
    step: int | None = None,
    references: dict[int, tuple[int, str]] | None = None,
) -> list[ShardInput]:
    """Split a template's KV into encoder inputs of ``shard_layers`` consecutive layers (the last may be shorter).

    ``step``: the sampler step of per-step KV (goes into every header); ``references``: for a cross-step residual
    (``kv`` = KV_s - KV_r), per first layer the (step, fp16 digest) of the shard it is coded against.
    """
    if shard_layers < 1:
        raise ValueError(f"shard_layers must be >= 1, got {shard_layers}")
    if importance is not None and importance.k_weight.shape[0] != kv.num_layers:
        raise ValueError(f"importance covers {importance.k_weight.shape[0]} layers, the KV has {kv.num_layers}")
    x = kv.kv.detach().float().cpu().numpy()  # (layers, 2, tokens, heads, head_dim)
    gain = np.ones(kv.num_layers) if importance is None else np.asarray(importance.layer_scale(), dtype=np.float64)
    out = []
    for first in range(0, kv.num_layers, shard_layers):
        last = min(first + shard_layers, kv.num_layers) - 1
        ref_step, ref_digest = (references or {}).get(first, (None, None))
        meta = ShardMeta(
            kv.model_id,
            template_id,
            kv.rope_layout,
            first,
            (kv.token_grid[0], kv.token_grid[1]),
            kv.num_layers,
            step,
            ref_step,
            ref_digest,
        )
        s = slice(first, last + 1)
        out.append(
            ShardInput(
                k=np.ascontiguousarray(x[s, 0]),
                v=np.ascontiguousarray(x[s, 1]),
                meta=meta,
                k_weight=None if importance is None else importance.k_weight[s] * _col(gain[s], 4),
                v_weight=None if importance is None else importance.v_weight[s] * _col(gain[s], 3),
                k_drop=None if importance is None else importance.k_drop[s] * _col(gain[s], 3),
            )
        )
    return out


def _col(gain: np.ndarray, ndim: int) -> np.ndarray:
    """(layers,) -> broadcastable to an ndim-dimensional (layers, ...) array, float32."""
    return gain.astype(np.float32).reshape((-1,) + (1,) * (ndim - 1))


def encode_kv(
    name: str,
    kv: TemplateKV,
    importance: ImportanceWeights | None,
    level: int,
    *,
    shard_layers: int = 1,
    template_id: str = "bench",
) -> list[list[bytes]]:
    """Encode a whole template with codec ``name`` at ``level``; per shard, the blob chain that decodes that level
    (base..level for a progressive codec, one blob otherwise)."""
    codec = get_codec(name)
    levels = [lv for lv in codec.levels if lv <= level] if codec.progressive else [level]
    shards = codec.prepare_shards(shard_inputs(kv, template_id, importance, shard_layers))
    return [codec.encode(s, levels) for s in shards]


def decode_kv(chains: list[list[bytes]]) -> torch.Tensor:
    """Decode per-shard chains (as :func:`encode_kv` returns them) into a (layers, 2, tokens, heads, head_dim) fp16
    tensor; the shards must cover the layers in order."""
    parts = []
    next_layer = 0
    for chain in chains:
        header, k, v = decode_chain(chain)
        if header.layer_first != next_layer:
            raise ValueError(f"shards out of order: expected layer {next_layer}, got {header.layer_first}")
        next_layer = header.layer_last + 1
        parts.append(torch.stack([torch.from_numpy(k), torch.from_numpy(v)], dim=1))  # (layers, 2, T, H, D)
    return torch.cat(parts)


def level_chains(shards: list[dict], blobs: dict[str, bytes], name: str) -> list[list[bytes]]:
    """Per shard (manifest ``shards``), the chain of blobs (base first) of the representation called ``name`` —
    what :func:`decode_kv` takes."""
    chains = []
    for shard in shards:
        rep = next(r for r in shard["representations"] if r["name"] == name)
        chains.append([blobs[d] for d in [*rep.get("requires", []), rep["digest"]]])
    return chains


def decode_per_step(shards: list[dict], blobs: dict[str, bytes], name: str, steps: int) -> torch.Tensor:
    """Every step of a per-step template decoded at the representation called ``name`` (float32, (steps, layers, 2,
    tokens, heads, head_dim)), following cross-step references: a residual adds the decoded reference shard (at the
    same name), a ``reuse`` representation takes it whole. ``name == "reuse"``: step 0 exact (fp16), every later step
    reuses the one before it; a closed-loop twin's name (``sakura-l2+cl``): step 0 at its level, then the twins.
    ``shards``: the manifest's, step-major."""
    decoded: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (step, first layer) -> fp16 K, V
    out = []
    for s in range(steps):
        parts = []
        for sh in (x for x in shards if x["step"] == s):
            first = sh["layers"][0]
            want = "fp16" if (name == "reuse" and s == 0) else (base_level_name(name) if s == 0 else name)
            rep = next(r for r in sh["representations"] if r["name"] == want)
            ref = rep.get("ref")
            if ref is not None and ref["mode"] == "reuse":
                k, v = decoded[(ref["step"], first)]
            else:
                reference = None
                if ref is not None:  # a residual: the reference shard is decoded first (earlier step)
                    rk, rv = decoded[(ref["step"], first)]
                    reference = DecodedReference(ref["step"], ref["digest"], rk, rv)
                _, k, v = decode_chain([blobs[d] for d in [*rep.get("requires", []), rep["digest"]]], reference)
            decoded[(s, first)] = (k, v)
            parts.append(torch.stack([torch.from_numpy(k), torch.from_numpy(v)], dim=1).float())
        out.append(torch.cat(parts))  # (layers, 2, tokens, heads, head_dim)
    return torch.stack(out)


def decode_template(manifest: dict, blobs: dict[str, bytes], name: str) -> TemplateKV | PerStepTemplateKV:
    """A whole template decoded at the representation called ``name`` (fp32), typed by the manifest's KV mode:
    a TemplateKV (single) or a PerStepTemplateKV tagged with the manifest's schedule (per-step)."""
    from .manifest import manifest_kv_mode

    grid, rope = tuple(manifest["token_grid"]), manifest["rope_layout"]
    if manifest_kv_mode(manifest) == "single":
        kv = decode_kv(level_chains(manifest["shards"], blobs, name)).float()  # (layers, 2, tokens, heads, hd)
        return TemplateKV(kv, manifest["model_id"], grid, rope)
    sched = manifest["schedule"]
    kv = decode_per_step(manifest["shards"], blobs, name, sched["steps"])  # (steps, layers, 2, tokens, heads, hd)
    return PerStepTemplateKV(kv, manifest["model_id"], grid, rope, tuple(float(t) for t in sched["timesteps"]))
