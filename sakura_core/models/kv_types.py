"""The one canonical type for template KV: what the server computes, the codec compresses and the runtime injects."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVMismatchError", "TemplateKV", "check_kv_compatible"]


class KVMismatchError(ValueError):
    """Template KV was computed for another model, token grid or RoPE layout than the one asked to use it."""


@dataclass(frozen=True)
class TemplateKV:
    """Post-RoPE key/value of a template's reference tokens, for every layer of one model.

    Attributes:
        kv: tensor of shape (layers, 2, tokens, heads, head_dim); index 0 of dim 1 is K, 1 is V.
            Layers are in execution order (double-stream blocks first, then single-stream blocks).
        model_id: content hash of the transformer config + weights the KV was computed with.
        token_grid: (rows, cols) of the template's token grid; rows * cols == tokens.
        rope_layout: name of the position-id layout of the reference tokens (e.g. ``"flux2-ref-t10"``).
    """

    kv: torch.Tensor
    model_id: str
    token_grid: tuple[int, int]
    rope_layout: str

    def __post_init__(self) -> None:
        if self.kv.ndim != 5 or self.kv.shape[1] != 2:
            raise ValueError(
                f"TemplateKV.kv must have shape (layers, 2, tokens, heads, head_dim), got {tuple(self.kv.shape)}"
            )
        rows, cols = self.token_grid
        if rows * cols != self.kv.shape[2]:
            raise ValueError(
                f"token_grid {self.token_grid} holds {rows * cols} tokens but kv has {self.kv.shape[2]} tokens"
            )

    @property
    def num_layers(self) -> int:
        return self.kv.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.kv.shape[2]

    @property
    def num_heads(self) -> int:
        return self.kv.shape[3]

    @property
    def head_dim(self) -> int:
        return self.kv.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, each (1, tokens, heads, head_dim) as diffusers' attention expects."""
        return self.kv[index, 0].unsqueeze(0), self.kv[index, 1].unsqueeze(0)

    def to(self, dtype: torch.dtype) -> TemplateKV:
        return TemplateKV(self.kv.to(dtype), self.model_id, self.token_grid, self.rope_layout)


def check_kv_compatible(
    kv_model_id: str,
    kv_grid: tuple[int, int],
    kv_rope: str,
    model_id: str,
    token_grid: tuple[int, int],
    rope_layout: str,
) -> None:
    """Raise :class:`KVMismatchError` naming both sides if KV computed for one setting is used with another."""
    if kv_model_id != model_id:
        raise KVMismatchError(
            f"template KV was computed for model {kv_model_id[:16]}… but the loaded model is {model_id[:16]}…; "
            "recompute the template KV for this model (sakura precompute) or load the model it was made for"
        )
    if tuple(kv_grid) != tuple(token_grid):
        raise KVMismatchError(
            f"template KV has token grid {tuple(kv_grid)} but this edit uses {tuple(token_grid)}; "
            "resize the edit to the template's resolution or precompute the template at this resolution"
        )
    if kv_rope != rope_layout:
        raise KVMismatchError(f"template KV uses RoPE layout {kv_rope!r} but the model expects {rope_layout!r}")
