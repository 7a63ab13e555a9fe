"""``sakura_core.models.model_id_cache``: a loaded module's id is hashed once, and again whenever its weights
changed in memory (another module, a weight replaced, a weight written in place) — never a stale id."""

from __future__ import annotations

import gc
import hashlib

import torch

from sakura_core.models.model_id_cache import ModuleIdCache


def _content(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(name.encode() + t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def test_the_same_weights_are_hashed_once():
    cache, module = ModuleIdCache(_content), torch.nn.Linear(4, 3)
    first = cache.model_id(module)
    assert cache.model_id(module) == first == _content(module.state_dict())
    assert cache.hashes == 1


def test_a_weight_written_in_place_or_replaced_is_hashed_again():
    cache, module = ModuleIdCache(_content), torch.nn.Linear(4, 3)
    before = cache.model_id(module)
    with torch.no_grad():
        module.weight.add_(1.0)  # a LoRA merged in place: same storage, new version
    patched = cache.model_id(module)
    assert patched != before and patched == _content(module.state_dict()) and cache.hashes == 2
    module.weight = torch.nn.Parameter(torch.zeros(3, 4))  # a host replacing the tensor
    assert cache.model_id(module) == _content(module.state_dict()) != patched and cache.hashes == 3
    module.bias.data = module.bias.data.to(torch.float64)  # another dtype
    assert cache.model_id(module) == _content(module.state_dict()) and cache.hashes == 4


def test_each_module_has_its_own_id_and_the_entry_goes_with_it():
    cache = ModuleIdCache(_content)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    assert cache.model_id(a) != cache.model_id(b) and cache.hashes == 2
    assert cache.model_id(a) == _content(a.state_dict()) and cache.hashes == 2
    del a
    gc.collect()
    assert len(cache._ids) == 1
