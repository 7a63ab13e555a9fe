"""EMULATED phone timing: the paced backend's layer times (a fake clock), the phone-scale numbers of a manifest
(hand-derived from the geometry's FLOP formula), and a live edit whose report shows it."""

from __future__ import annotations

import math

import pytest
from typed_manifests import unchecked_manifest

from sakura_core.fetch.traces import Trace
from sakura_core.runtime.emulated_device import EmulatedTiming, PacedBackend

L = 4


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class FakeInner:
    """Runs ``L`` layers as the adapter does (hook, split decision, cached KV), each costing 0.01 s of host time."""

    name = "fake"

    def __init__(self, clock: Clock, kv_wait_s: dict[int, float]):
        self.clock, self.kv_wait_s, self.ends = clock, kv_wait_s, []

    def forward(self, x, *, split_layer, on_layer, cached, ref_tokens, **kwargs):
        keep = split_layer if callable(split_layer) else (lambda layer: layer < split_layer)
        live = ref_tokens is not None
        for layer in range(L):
            on_layer(layer)
            self.ends.append(self.clock())
            if live and not keep(layer):
                live = False
            if not live:
                cached(layer)
            self.clock.t += 0.01
        return "result"

    def extract_template_kv(self, *args, **kwargs):
        self.clock.t += 0.01
        return "kv"

    def resume_template_kv(self, hidden, grid, start, ref_t=None, stop=None):
        out = []
        for layer in range(start, L):
            self.clock.t += 0.01
            out.append(layer)
            if stop is not None and stop(layer, ("k", "v")):
                break
        return out

    def describe(self):
        return {"backend": "fake"}


def _timing(**kw) -> EmulatedTiming:
    base = dict(
        profile="snapdragon-8-elite-cpu",
        layers=L,
        phone_layers_per_layer=1.0,
        layer_full_s=1.0,
        layer_cached_s=0.5,
        template_layer_s=0.25,
        bytes_scale=10.0,
    )
    return EmulatedTiming(**{**base, **kw})


def _kv_waiting(clock: Clock, waits: dict[int, float]):
    def cached(layer):
        clock.t += waits.get(layer, 0.0)  # the shard arrives this much later
        return ("k", "v")

    return cached


def test_layers_take_the_phone_time_from_when_their_kv_is_there():
    clock = Clock()
    inner = FakeInner(clock, {})
    paced = PacedBackend(inner, _timing(), clock=clock, sleep=clock.sleep)
    hooked = []
    # the template is dropped at layer 2; layer 3's shard comes 0.7 s late
    out = paced.forward(
        "x",
        split_layer=lambda layer: layer < 2,
        on_layer=hooked.append,
        cached=_kv_waiting(clock, {3: 0.7}),
        ref_tokens="t",
    )
    assert out == "result" and hooked == [0, 1, 2, 3]
    # layer starts: 0, 1.0, 2.0 (two template layers of 1 s), 2.5 (a cached layer); layer 3 ends 0.7 + 0.5 later
    assert inner.ends == pytest.approx([0.0, 1.0, 2.0, 2.5])
    assert clock.t == pytest.approx(2.5 + 0.7 + 0.5)


def test_a_fixed_split_and_template_passes_are_paced():
    clock = Clock()
    paced = PacedBackend(FakeInner(clock, {}), _timing(), clock=clock, sleep=clock.sleep)
    paced.forward("x", split_layer=1, on_layer=None, cached=_kv_waiting(clock, {}), ref_tokens="t")
    assert clock.t == pytest.approx(1.0 + 3 * 0.5)
    clock.t = 0.0
    paced.forward("x", split_layer=0, on_layer=None, cached=_kv_waiting(clock, {}), ref_tokens=None)
    assert clock.t == pytest.approx(4 * 0.5)
    clock.t = 0.0
    assert paced.extract_template_kv("tokens", (2, 2)) == "kv"
    assert clock.t == pytest.approx(4 * 0.25)
    assert paced.describe() == {"backend": "fake", "timing": "EMULATED: paced to snapdragon-8-elite-cpu"}


def test_phone_scale_numbers_of_the_demo_manifest():
    """The demo model (6 layers, 16x16 template tokens, 4 heads x 24) on snapdragon-8-elite-cpu, phone-dit-512."""
    manifest = unchecked_manifest({"num_layers": 6, "token_grid": [16, 16], "heads": 4, "head_dim": 24})
    t = EmulatedTiming.for_manifest("snapdragon-8-elite-cpu", manifest)
    assert t.phone_layers_per_layer == 4.0  # 24 phone layers / 6
    # by hand: d = 1024, 1152 request tokens (1024 image + 128 text), 1024 template tokens, 0.8e12 / 4 s FLOP/s
    d, r, tmpl, flops_s = 1024, 1152, 1024, 0.8e12 / 4.0
    cached = 26 * d**2 * r + 4 * r * (r + tmpl) * d
    template = 26 * d**2 * tmpl + 4 * tmpl * tmpl * d
    assert t.layer_cached_s == pytest.approx(4 * (cached / flops_s + 1e-4))
    assert t.layer_full_s == pytest.approx(4 * ((cached + template) / flops_s + 1e-4))
    assert t.template_layer_s == pytest.approx(4 * (template / flops_s + 1e-4))
    # a phone shard is 2 x 1024 tokens x 1024 x 2 B = 4 MiB; the demo's 2 x 256 x 96 x 2 B = 96 KiB; 4 per layer
    assert t.bytes_scale == pytest.approx(4 * 4 * 2**20 / (96 * 2**10))
    trace = t.phone_scale_trace(Trace.constant(20.0))
    assert trace.rates_bytes_per_s[0] == pytest.approx(20e6 / 8 / t.bytes_scale) and trace.name == "const-20mbps"
    est = t.estimator_config()
    assert est.min_sample_bytes == math.floor(16 * 1024 / t.bytes_scale)
    assert est.prior_bytes_per_s == pytest.approx(0.5e6 / 8 / t.bytes_scale)
    with pytest.raises(ValueError, match="unknown device profile 'pixel'"):
        EmulatedTiming.for_manifest("pixel", manifest)


def test_two_references_make_the_phones_template_twice_as_large():
    """A two-reference demo template (its 2 x 256 tokens stacked 32x16): the phone's DiT then holds 2 x 1024 template
    tokens, attending to each other (by hand as above, with 2048 template tokens)."""
    manifest = unchecked_manifest(
        {"num_layers": 6, "token_grid": [32, 16], "rope_layout": "flux2-ref-t10-x2", "heads": 4, "head_dim": 24}
    )
    t = EmulatedTiming.for_manifest("snapdragon-8-elite-cpu", manifest)
    d, r, tmpl, flops_s = 1024, 1152, 2048, 0.8e12 / 4.0
    cached = 26 * d**2 * r + 4 * r * (r + tmpl) * d
    template = 26 * d**2 * tmpl + 4 * tmpl * tmpl * d
    assert t.layer_cached_s == pytest.approx(4 * (cached / flops_s + 1e-4))
    assert t.template_layer_s == pytest.approx(4 * (template / flops_s + 1e-4))
    # phone shard 2 x 2048 x 1024 x 2 B = 8 MiB; the demo's 2 x 512 x 96 x 2 B = 192 KiB: the same scale as one
    assert t.bytes_scale == pytest.approx(4 * 8 * 2**20 / (192 * 2**10))


def test_a_fallback_pass_is_paced_layer_by_layer_and_takes_the_time_of_the_layers_it_ran():
    clock = Clock()
    paced = PacedBackend(FakeInner(clock, {}), _timing(), clock=clock, sleep=clock.sleep)
    asked = []

    def stop(layer, kv):
        asked.append((layer, clock.t))
        return layer == 2

    assert paced.resume_template_kv("h", (2, 2), 1, None, stop) == [1, 2]
    # each layer asked once its phone time (0.25 s) has passed; the pass ends with its second layer
    assert asked == [(1, pytest.approx(0.25)), (2, pytest.approx(0.5))]
    assert clock.t == pytest.approx(0.5)
    clock.t = 0.0
    assert paced.resume_template_kv("h", (2, 2), 1) == [1, 2, 3]  # no stop: to the last layer
    assert clock.t == pytest.approx(3 * 0.25)
