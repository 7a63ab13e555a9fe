"""EMULATED phone timing for a live edit: what the same edit would take on a phone running a phone-class DiT.

The demo model is tiny: this host computes a layer of it faster than any link delivers its KV, so a live edit here
computes most layers (a probe shard is fetched, the rest computed). :class:`EmulatedTiming` runs the real edit (real
shards, fetch, decode, policy, image) with the times of a phone instead:

* compute: every layer of the model stands for ``phone layers / model layers`` layers of the device profile's DiT
  (``sakura_core.runtime.profiles``: published phone throughput, phone-dit-512 geometry); :class:`PacedBackend`
  waits until each layer has taken that long (a template layer ``layer_full_s``, a cached one ``layer_cached_s``,
  counted from when its KV is there), and the policy predicts with the same times (:meth:`live_profile`);
* link: the emulated link is slowed by ``bytes_scale`` (phone shard bytes / model shard bytes), so a model shard
  takes as long as the phone's shard would at the link's stated rate (:meth:`phone_scale_trace`); the throughput
  estimator's prior and smallest sample are scaled the same way (:meth:`estimator_config`).

Not scaled: decode (the model's shards decode in milliseconds; a phone's would take ~7 ms per 4 MiB layer at
6e8 B/s, small next to its ~0.2 s layer) and the request's round trips. Reports label every number as emulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..fetch.traces import Trace
from ..kv.manifest import Manifest
from ..policy.estimator import EstimatorConfig
from .live_profile import LiveProfile
from .profiles import PROFILES, DeviceProfile, get_profile

__all__ = ["EMULATED_LABEL", "EmulatedTiming", "PacedBackend", "profile_for_template"]

EMULATED_LABEL = (
    "EMULATED phone timing (not measured on a phone): compute paced to the device profile's phone-class DiT, the "
    "link slowed by bytes_scale so each shard takes as long as the phone's; the image is this model's, computed here"
)


def _model_shard_bytes_fp16(manifest: Manifest) -> int:
    """One layer's template K and V of the manifest's model in fp16."""
    rows, cols = manifest.token_grid
    return 2 * rows * cols * manifest.heads * manifest.head_dim * 2  # K and V, 2 bytes each


def profile_for_template(profile: DeviceProfile, manifest: Manifest) -> DeviceProfile:
    """``profile`` with its phone DiT holding as many template images as the template ``manifest`` has references
    (its ``token_grid`` / ``rope_layout``): a try-on's two references are twice the phone's template tokens and KV,
    attending to each other. A one-reference template: ``profile`` itself."""
    refs = len(manifest.references)
    if refs == 1:
        return profile
    return profile.with_geometry(profile.model.with_fields(template_tokens=refs * profile.model.template_tokens))


@dataclass(frozen=True)
class EmulatedTiming:
    """A phone's times for an edit of a model with ``layers`` layers (build it with :meth:`for_manifest`).

    Attributes:
        profile: device profile name (``sakura_core.runtime.profiles.PROFILES``).
        layers: layers of the model that edits.
        phone_layers_per_layer: phone DiT layers each model layer stands for (> 0).
        layer_full_s: one model layer that runs the template tokens too, seconds (emulated).
        layer_cached_s: one model layer with the template KV injected, seconds (emulated).
        template_layer_s: the template tokens' own part of one model layer (fallback passes), seconds.
        bytes_scale: phone shard bytes / model shard bytes (>= 1 slows the link).
    """

    profile: str
    layers: int
    phone_layers_per_layer: float
    layer_full_s: float
    layer_cached_s: float
    template_layer_s: float
    bytes_scale: float

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown device profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        times = (self.layer_full_s, self.layer_cached_s, self.template_layer_s)
        if self.layers < 1 or not self.phone_layers_per_layer > 0 or not min(times) > 0 or not self.bytes_scale > 0:
            raise ValueError(f"emulated timing {self}: layers >= 1, and every time and scale > 0")

    @classmethod
    def for_manifest(cls, profile_name: str, manifest: Manifest) -> EmulatedTiming:
        """The profile's phone times for the model a template ``manifest`` was computed for; a template of several
        reference images makes the phone's template as many times larger (its tokens attend to each other)."""
        profile = profile_for_template(get_profile(profile_name), manifest)
        layers = manifest.num_layers
        per = profile.model.layers / layers
        return cls(
            profile=profile.name,
            layers=layers,
            phone_layers_per_layer=per,
            layer_full_s=per * profile.layer_full_s,
            layer_cached_s=per * profile.layer_cached_s,
            template_layer_s=per * profile.seconds(profile.model.template_layer_flops),
            bytes_scale=per * profile.model.shard_bytes_fp16 / _model_shard_bytes_fp16(manifest),
        )

    def live_profile(self, steps: int) -> LiveProfile:
        """What the policy predicts with: the emulated per-layer times."""
        return LiveProfile(self.layer_full_s, self.layer_cached_s, self.layers, steps)

    def estimator_config(self) -> EstimatorConfig:
        """The throughput estimator at phone scale: its prior and its smallest sample divided by :attr:`bytes_scale`
        (a model shard is ``bytes_scale`` times smaller than the phone's, so it must still count as a sample)."""
        d = EstimatorConfig()
        return EstimatorConfig(
            d.window, max(1, int(d.min_sample_bytes / self.bytes_scale)), d.prior_bytes_per_s / self.bytes_scale
        )

    def phone_scale_trace(self, trace: Trace) -> Trace:
        """``trace`` slowed by :attr:`bytes_scale` (same name, so reports name the link the user chose)."""
        return Trace(
            trace.name,
            trace.durations_s,
            trace.rates_bytes_per_s / self.bytes_scale,
            trace.latency_ms,
            trace.source,
            trace.trace_class,
        )

    def backend(self, inner, *, clock: Callable[[], float] = time.monotonic, sleep=time.sleep) -> PacedBackend:
        return PacedBackend(inner, self, clock=clock, sleep=sleep)

    def describe(self, bytes_fetched: int) -> dict:
        """The report's ``executed_on["timing"]`` section."""
        profile = get_profile(self.profile)
        g = profile.model
        return {
            "label": EMULATED_LABEL,
            "profile": profile.name,
            "soc": profile.soc,
            "phone_model": f"{g.name}: {g.layers} layers, width {g.width}, {g.image_tokens} image + "
            f"{g.template_tokens} template tokens; each of the model's {self.layers} layers stands for "
            f"{self.phone_layers_per_layer:g}",
            "layer_full_s": round(self.layer_full_s, 4),
            "layer_cached_s": round(self.layer_cached_s, 4),
            "bytes_scale": round(self.bytes_scale, 2),
            "phone_scale_bytes_fetched": int(round(bytes_fetched * self.bytes_scale)),
        }


class PacedBackend:
    """A compute backend whose layers take at least the emulated phone's time (see the module doc).

    ``forward`` runs the inner backend and waits, before each layer hook and after the last layer, until the layer
    before has lasted ``layer_full_s`` (template tokens still in) or ``layer_cached_s`` from when its KV was there
    (a late shard's wait is not emulated compute); template-only passes last ``template_layer_s`` per layer.
    """

    def __init__(self, inner, timing: EmulatedTiming, *, clock=time.monotonic, sleep=time.sleep):
        self.inner, self.timing, self.clock, self._sleep = inner, timing, clock, sleep
        self.name = f"{inner.name} (paced: {timing.profile})"

    def _wait_until(self, deadline: float) -> None:
        left = deadline - self.clock()
        if left > 0:
            self._sleep(left)

    def forward(self, *args, split_layer=0, on_layer=None, cached=None, ref_tokens=None, **kwargs):
        pacer = _LayerPacer(self, split_layer, ref_tokens is not None, on_layer)
        if callable(cached):
            cached = pacer.wrap_cached(cached)
        result = self.inner.forward(
            *args,
            split_layer=pacer.split_arg(),
            on_layer=pacer.on_layer,
            cached=cached,
            ref_tokens=ref_tokens,
            **kwargs,
        )
        pacer.close()
        return result

    def extract_template_kv(self, *args, **kwargs):
        deadline = self.clock() + self.timing.layers * self.timing.template_layer_s
        out = self.inner.extract_template_kv(*args, **kwargs)
        self._wait_until(deadline)
        return out

    def resume_template_kv(self, ref_hidden, token_grid, start_layer: int, ref_timestep=None, stop=None):
        """Paced layer by layer: ``stop`` is asked once each layer's emulated time has passed (so the link's progress
        meanwhile is what it sees), and the pass takes the time of the layers it ran."""
        t0, layer_s = self.clock(), self.timing.template_layer_s

        def paced(layer: int, kv) -> bool:
            self._wait_until(t0 + (layer - start_layer + 1) * layer_s)
            return stop is not None and stop(layer, kv)

        out = self.inner.resume_template_kv(ref_hidden, token_grid, start_layer, ref_timestep, paced)
        self._wait_until(t0 + len(out) * layer_s)
        return out

    def describe(self) -> dict:
        return {**self.inner.describe(), "timing": f"EMULATED: paced to {self.timing.profile}"}


class _LayerPacer:
    """One forward's pacing state: the open layer, whether the template tokens are still in, when its KV came."""

    def __init__(self, owner: PacedBackend, split_layer, has_template: bool, on_layer):
        self.owner, self.split, self.user_hook = owner, split_layer, on_layer
        self.alive = has_template and (callable(split_layer) or split_layer > 0)
        self.layer: int | None = None
        self.start = 0.0

    def split_arg(self):
        if not callable(self.split):
            return self.split

        def keep(layer: int) -> bool:
            kept = self.split(layer)
            if not kept:
                self.alive = False
            return kept

        return keep

    def wrap_cached(self, cached):
        def kv(layer: int):
            out = cached(layer)
            self.start = max(self.start, self.owner.clock())  # compute starts once the KV is there
            return out

        return kv

    def _full(self, layer: int) -> bool:
        if callable(self.split):
            return self.alive
        return self.alive and layer < self.split

    def close(self) -> None:
        """Wait out the open layer."""
        if self.layer is not None:
            t = self.owner.timing
            self.owner._wait_until(self.start + (t.layer_full_s if self._full(self.layer) else t.layer_cached_s))

    def on_layer(self, layer: int) -> None:
        self.close()
        self.layer, self.start = layer, self.owner.clock()
        if self.user_hook is not None:
            self.user_hook(layer)
