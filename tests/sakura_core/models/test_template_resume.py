"""The device's fallback template pass resumes where a hybrid forward dropped the template tokens: from their hidden
state there (``on_drop``) the rest of the pass gives exactly the KV a whole template-only pass gives."""

import pytest
import torch

from sakura_core.models.flux2_kv import Flux2KVAdapter

from .test_flux2_kv import GRID, N, _request, _tiny


@pytest.fixture(scope="module")
def adapter():
    return Flux2KVAdapter(_tiny())


def _dropped_at(adapter, ref, split, ref_timestep=None, batch=1):
    """A hybrid forward of a real request (batch of ``batch``) that drops the template before ``split``: what
    ``on_drop`` saw."""
    x, txt, t = _request(3)
    x, txt, t = x.expand(batch, -1, -1), txt.expand(batch, -1, -1), t.expand(batch)
    seen = []
    whole = adapter.extract_template_kv(ref, GRID, ref_timestep=ref_timestep)
    adapter.forward(
        x,
        txt,
        t,
        img_grid=GRID,
        ref_tokens=ref,
        ref_grid=GRID,
        split_layer=split,
        cached=whole,
        ref_timestep=ref_timestep,
        on_drop=lambda layer, h: seen.append((layer, h)),
    )
    return whole, seen


def _stop_at_once(asked: list):
    def stop(layer, kv):
        asked.append((layer, kv[0]))
        return True

    return stop


@pytest.mark.parametrize("ref_timestep", [None, 0.75])
def test_resuming_at_every_split_gives_the_whole_passes_kv(adapter, ref_timestep):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(11))
    L = adapter.num_layers
    for split in range(1, L):  # 1 .. L-1: double blocks, the double/single boundary (2), single blocks
        whole, seen = _dropped_at(adapter, ref, split, ref_timestep)
        assert [layer for layer, _ in seen] == [split]
        rest = adapter.resume_template_kv(seen[0][1], GRID, split, ref_timestep=ref_timestep)
        assert len(rest) == L - split
        for i, (k, v) in enumerate(rest):
            assert torch.allclose(k[0], whole.kv[split + i, 0], atol=1e-6), (split, i)
            assert torch.allclose(v[0], whole.kv[split + i, 1], atol=1e-6), (split, i)
        # abandoned after its first layer (stop is asked with each layer's KV): that layer only, the same KV
        asked = []
        first = adapter.resume_template_kv(seen[0][1], GRID, split, ref_timestep, _stop_at_once(asked))
        assert len(first) == 1 and asked[0][0] == split and torch.equal(asked[0][1], first[0][0])
        assert torch.allclose(first[0][0][0], whole.kv[split, 0], atol=1e-6)


def test_the_hidden_state_does_not_depend_on_the_request_or_the_batch(adapter):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(12))
    _, one = _dropped_at(adapter, ref, 3)
    _, two = _dropped_at(adapter, ref, 3, batch=2)
    cfg = adapter.model.config
    assert one[0][1].shape == (1, N, cfg.num_attention_heads * cfg.attention_head_dim)
    assert torch.allclose(one[0][1], two[0][1], atol=1e-6)


def test_a_resume_from_the_embedded_tokens_is_the_whole_pass(adapter):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(13))
    whole = adapter.extract_template_kv(ref, GRID)
    rest = adapter.resume_template_kv(adapter.model.x_embedder(ref), GRID, 0)
    assert torch.allclose(torch.stack([torch.stack([k[0], v[0]]) for k, v in rest]), whole.kv, atol=1e-6)
    assert adapter.resume_template_kv(adapter.model.x_embedder(ref), GRID, adapter.num_layers) == []


def test_no_drop_no_hook_and_bad_input_is_refused(adapter):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(14))
    whole, seen = _dropped_at(adapter, ref, adapter.num_layers)  # the template ran to the end: nothing dropped
    assert seen == []
    x, txt, t = _request(4)
    adapter.forward(x, txt, t, img_grid=GRID, split_layer=0, cached=whole, on_drop=lambda *a: seen.append(a))
    assert seen == []  # no template tokens ran
    with pytest.raises(ValueError, match=r"ref_hidden must be \(1, 16, 32\)"):
        adapter.resume_template_kv(torch.zeros(1, 9, 32), GRID, 1)
    with pytest.raises(ValueError, match=r"start_layer must be in \[0, 4\]"):
        adapter.resume_template_kv(torch.zeros(1, N, 32), GRID, 5)


@pytest.mark.parametrize("ref_timestep", [None, 0.75])
def test_the_pass_layer_by_layer_gives_the_whole_passes_kv(adapter, ref_timestep):
    """``template_layer`` chained from the embedded tokens (the web export's per-layer graphs) gives every layer's KV
    of the whole pass at that time, and hands over the hidden state a hybrid forward drops there."""
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(13))
    m = adapter.model
    t = torch.full((1,), (adapter.ref_fixed_timestep if ref_timestep is None else ref_timestep) * 1000)
    temb = m.time_guidance_embed(t, None)
    whole = adapter.extract_template_kv(ref, GRID, ref_timestep=ref_timestep)
    other = adapter.extract_template_kv(ref, GRID, ref_timestep=0.25)  # another time: another KV
    h = m.x_embedder(ref)
    for layer in range(adapter.num_layers):
        if layer:
            _, seen = _dropped_at(adapter, ref, layer, ref_timestep)
            assert torch.allclose(h, seen[0][1], atol=1e-6), layer
        k, v, h = adapter.template_layer(h, GRID, layer, temb)
        assert torch.allclose(k[0], whole.kv[layer, 0], atol=1e-6), layer
        assert torch.allclose(v[0], whole.kv[layer, 1], atol=1e-6), layer
        assert not torch.allclose(k[0], other.kv[layer, 0], atol=1e-3), layer
    with pytest.raises(ValueError, match=r"layer must be in \[0, 3\], got 4"):
        adapter.template_layer(h, GRID, adapter.num_layers, temb)
