"""The one canonical type for template KV: what the server computes, the codec compresses and the runtime injects."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ref_layout import grids_of

__all__ = ["KV_MODES", "KVMismatchError", "PerStepTemplateKV", "TemplateKV", "check_kv_compatible"]

# ``single``: one KV per layer, template tokens at a fixed time, reused by every step (FLUX.2 [klein] KV mode).
# ``per-step``: one KV per (step, layer), template tokens modulated at each step's own time (docs/design.md).
KV_MODES = ("single", "per-step")


class KVMismatchError(ValueError):
    """Template KV was computed for another model, token grid or RoPE layout than the one asked to use it."""


@dataclass(frozen=True)
class TemplateKV:
    """Post-RoPE key/value of a template's reference tokens, for every layer of one model.

    Attributes:
        kv: tensor of shape (layers, 2, tokens, heads, head_dim); index 0 of dim 1 is K, 1 is V.
            Layers are in execution order (double-stream blocks first, then single-stream blocks).
        model_id: content hash of the transformer config + weights the KV was computed with.
        token_grid: (rows, cols) of the template's token grid; rows * cols == tokens (several references: their
            grids stacked, see :mod:`.ref_layout`).
        rope_layout: name of the position-id layout of the reference tokens (``"flux2-ref-t10"``: one reference;
            ``"flux2-ref-t10-xN"``: N references).
        ref_timestep: time (0..1) the template tokens were modulated with: the fixed reference time in ``single``
            mode, the step's own time in ``per-step`` mode.
    """

    kv: torch.Tensor
    model_id: str
    token_grid: tuple[int, int]
    rope_layout: str
    ref_timestep: float = 0.0

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
    def ref_grids(self) -> tuple[tuple[int, int], ...]:
        """The grid of each reference image the tokens hold, in order (:func:`.ref_layout.grids_of`)."""
        return grids_of(self.token_grid, self.rope_layout)

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
        return TemplateKV(self.kv.to(dtype), self.model_id, self.token_grid, self.rope_layout, self.ref_timestep)


@dataclass(frozen=True)
class PerStepTemplateKV:
    """``per-step`` template KV: the template tokens' post-RoPE K/V at every (sampler step, layer).

    Attributes:
        kv: (steps, layers, 2, tokens, heads, head_dim); ``kv[s]`` is the KV of step ``s``.
        model_id, token_grid, rope_layout: as in :class:`TemplateKV`.
        timesteps: the time (0..1) of each step, ``flow_timesteps(steps, shift)[:-1]``; step ``s``'s KV is only
            valid for a sampler that runs step ``s`` at ``timesteps[s]``.
    """

    kv: torch.Tensor
    model_id: str
    token_grid: tuple[int, int]
    rope_layout: str
    timesteps: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.kv.ndim != 6 or self.kv.shape[2] != 2:
            raise ValueError(
                "PerStepTemplateKV.kv must have shape (steps, layers, 2, tokens, heads, head_dim), "
                f"got {tuple(self.kv.shape)}"
            )
        if len(self.timesteps) != self.kv.shape[0]:
            raise ValueError(f"{len(self.timesteps)} timesteps for {self.kv.shape[0]} steps of KV: give one per step")
        self.at_step(0)  # validates the grid

    @property
    def num_steps(self) -> int:
        return self.kv.shape[0]

    @property
    def ref_grids(self) -> tuple[tuple[int, int], ...]:
        return grids_of(self.token_grid, self.rope_layout)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def at_step(self, step: int) -> TemplateKV:
        """The KV of one step, tagged with its time (what the adapter injects at that step)."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} out of range: this template KV holds steps 0..{self.num_steps - 1}")
        return TemplateKV(self.kv[step], self.model_id, self.token_grid, self.rope_layout, self.timesteps[step])


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
