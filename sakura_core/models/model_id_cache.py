"""Model ids of loaded torch modules, hashed once per module and weights: :class:`ModuleIdCache`.

Hashing a model's tensors (``flux2_parts.content_id``) reads every byte of its weights — seconds for a real klein —
and a host (ComfyUI) asks for the id of the same loaded model at every run. The cache keeps one id per live module
(weakly: the entry goes with the module) together with a fingerprint of its weights as they are in memory: each
tensor's name, storage address, in-place version counter, dtype, shape and device. Loading another file makes
another module or other tensors; a patch that replaces a weight (a LoRA merged by a host) changes its address; one
written in place bumps its version counter. Any of these misses the cache and hashes again, so a cached id is
always the one hashing the weights now would give.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

__all__ = ["ModuleIdCache", "weights_fingerprint"]


def weights_fingerprint(state: dict[str, torch.Tensor]) -> tuple:
    """What identifies ``state``'s tensors in memory without reading them: per tensor its name, storage address,
    in-place version counter (``Tensor._version``), dtype, shape and device."""
    return tuple(
        (name, t.data_ptr(), t._version, str(t.dtype), tuple(t.shape), str(t.device)) for name, t in state.items()
    )


class ModuleIdCache:
    """``model_id(module)``: ``compute(module.state_dict())``, hashed again only when the module's weights changed
    (see the module docstring). ``hashes``: how many times it computed (the rest were cached)."""

    def __init__(self, compute: Callable[[dict[str, torch.Tensor]], str]):
        self._compute = compute
        self._ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (fingerprint, id)
        self.hashes = 0

    def model_id(self, module: torch.nn.Module) -> str:
        state = module.state_dict()
        fingerprint = weights_fingerprint(state)
        hit = self._ids.get(module)
        if hit is not None and hit[0] == fingerprint:
            return hit[1]
        model_id = self._compute(state)
        self.hashes += 1
        self._ids[module] = (fingerprint, model_id)
        return model_id
