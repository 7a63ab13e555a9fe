"""The compute-backend seam of the runtime: what runs the model's blocks for the compute lane.

The compute lane (:func:`~sakura_core.runtime.denoise.run_edit`, driven by
:class:`~sakura_core.runtime.pipeline.PipelinedEdit`) asks a backend for one transformer forward per step: template
layers ``< k`` computed (their K/V kept), cached-KV layers ``>= k`` with the injected template K/V, the step's
timestep (and, in ``per-step`` KV mode, the template tokens' timestep) as inputs. A backend has the signature of
:meth:`~sakura_core.models.flux2_kv.Flux2KVAdapter.forward`, so the torch adapter itself is the reference backend
(:class:`TorchBackend` only names it); ``android_bridge.qnn_backend.QnnBackend`` runs the same forward as per-layer
ONNX graphs on the (emulated) Hexagon HTP. Policies, fetch, decode and fallbacks do not change with the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..models.flux2_kv import Flux2KVAdapter, ForwardResult
from ..models.kv_types import TemplateKV
from ..models.ref_layout import TokenLayout

__all__ = ["ComputeBackend", "TorchBackend", "backend_of"]


class ComputeBackend(Protocol):
    """Runs the model's blocks. ``name`` ("torch", "qnn"); ``forward`` as ``Flux2KVAdapter.forward`` (keyword
    ``ref_timestep`` is the template tokens' time in per-step mode, None = the fixed reference time);
    ``extract_template_kv`` a template-only pass; ``resume_template_kv`` its layers from ``start_layer`` on, from the
    template tokens' hidden state that ``forward``'s ``on_drop`` handed over (the device's fallback when shards are
    late: the layers before the drop are not run again), one layer at a time: ``stop(layer, (k, v))``, asked after
    each layer's KV, ends it there (True) — the fallback abandoned once the link has delivered the rest;
    ``describe()`` what the agent's ``/v1/info`` and the report say about where the compute runs."""

    name: str

    def forward(
        self,
        x: torch.Tensor,
        txt: torch.Tensor,
        timestep: torch.Tensor,
        *,
        img_grid: tuple[int, int],
        ref_tokens: torch.Tensor | None = None,
        ref_grid: tuple[int, int] | None = None,
        split_layer: int | Callable[[int], bool] = 0,
        cached=None,
        on_layer: Callable[[int], None] | None = None,
        on_drop: Callable[[int, torch.Tensor], None] | None = None,
        **kwargs,
    ) -> ForwardResult: ...

    def extract_template_kv(
        self, ref_tokens: torch.Tensor, token_grid: TokenLayout, ref_timestep: float | None = None
    ) -> TemplateKV: ...

    def resume_template_kv(
        self,
        ref_hidden: torch.Tensor,
        token_grid: TokenLayout,
        start_layer: int,
        ref_timestep=None,
        stop: Callable[[int, tuple[torch.Tensor, torch.Tensor]], bool] | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    def describe(self) -> dict: ...


class TorchBackend:
    """The reference backend: the torch adapter on this host's CPU (diffusers' own blocks)."""

    name = "torch"

    def __init__(self, adapter: Flux2KVAdapter):
        self.adapter = adapter

    def forward(self, *args, **kwargs) -> ForwardResult:
        return self.adapter.forward(*args, **kwargs)

    def extract_template_kv(self, *args, **kwargs) -> TemplateKV:
        return self.adapter.extract_template_kv(*args, **kwargs)

    def resume_template_kv(self, *args, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.adapter.resume_template_kv(*args, **kwargs)

    def describe(self) -> dict:
        return {"backend": "torch", "where": "this host's CPU (torch, diffusers blocks)", "emulated_htp": False}


def backend_of(model, backend: ComputeBackend | None) -> ComputeBackend:
    """``backend``, or the model's torch adapter (the reference) when None."""
    return backend if backend is not None else TorchBackend(model.adapter)
