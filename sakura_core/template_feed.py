"""A template's KV streamed layer by layer for a host's own forward (ComfyUI's native klein through its patch points).

:class:`TemplateKVFeed` fetches one representation (``"fp16"`` = exact) of every shard of a published template in
execution order (per-step: step-major) in a worker thread, decodes each as it arrives, and hands a layer's K/V to
whoever asks for it — waiting while that layer is not decoded yet. It knows nothing of the host: the ComfyUI node
(``nodes/template_kv_patch.py``) maps ComfyUI's ``(block_type, block_index)`` to a layer with :func:`layer_index`
and a sampler sigma to a step with :func:`step_of_sigma`.

One feed is one run: :meth:`TemplateKVFeed.start` begins the fetch, :meth:`TemplateKVFeed.reset` stops it and drops
every decoded tensor (the node calls it in a ``finally`` when the sampler returns).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .kv.chain import DecodedReference, decode_chain
from .kv.manifest import Manifest, Representation, Shard

__all__ = ["FeedStats", "TemplateKVFeed", "layer_index", "step_of_sigma"]

logger = logging.getLogger(__name__)

EXACT = "fp16"


def layer_index(block_type: str, block_index: int, num_double: int) -> int:
    """SAKURA's layer number (execution order: the double-stream blocks, then the single-stream blocks) of a block
    that ComfyUI's FLUX forward names ``(block_type, block_index)``."""
    if block_type == "double":
        return int(block_index)
    if block_type == "single":
        return num_double + int(block_index)
    raise ValueError(f"unknown FLUX block type {block_type!r}: expected 'double' or 'single'")


def step_of_sigma(sigma: float, timesteps: tuple[float, ...], tolerance: float = 1e-4) -> int:
    """The step of a per-step template's schedule whose time equals the sampler's ``sigma`` (flow matching: the
    model's timestep is sigma); ``ValueError`` naming both when no step is within ``tolerance``."""
    best = min(range(len(timesteps)), key=lambda s: abs(timesteps[s] - sigma))
    if abs(timesteps[best] - sigma) > tolerance:
        shown = ", ".join(f"{t:.4g}" for t in timesteps)
        raise ValueError(
            f"the sampler is at sigma {sigma:.6g}, which is no step of the per-step template's schedule ({shown}); "
            "run it with the template's step count and scheduler (its manifest's schedule), or use a single-mode "
            "template"
        )
    return best


@dataclass
class FeedStats:
    """What one run's feed did: shards and bytes fetched, seconds the forward waited for a layer (total, count)."""

    shards: int = 0
    bytes: int = 0
    wait_s: float = 0.0
    waits: int = 0
    representation: str = EXACT
    first_layer_ready_s: float | None = None
    done_s: float | None = None
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "representation": self.representation,
            "shards": self.shards,
            "bytes": self.bytes,
            "wait_s": round(self.wait_s, 4),
            "waits": self.waits,
            "done_s": None if self.done_s is None else round(self.done_s, 3),
        }


class TemplateKVFeed:
    """Fetch + decode a template's shards in a worker thread; :meth:`kv` returns a layer's K/V when decoded.

    Args:
        source: where the template is served (``sakura_core.fetch.sources``: a server or a local store).
        manifest: its manifest, already checked against the model.
        representation: the representation name fetched for every shard (``"fp16"``: the exact KV).
    """

    def __init__(self, source, manifest: Manifest, representation: str = EXACT):
        self.source = source
        self.manifest = manifest
        self.representation = representation
        self.steps = manifest.schedule.steps if manifest.schedule is not None else 1  # per-step manifests only
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.reset()

    # ---- lifetime -----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Stop a running fetch (it ends after its current shard) and drop every decoded tensor."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30.0)
        with self._cond:
            self._layers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
            self._error: BaseException | None = None
            self._finished = False
            self._stop = False
            self._thread = None
            self.stats = FeedStats(representation=self.representation)

    def start(self) -> None:
        """Begin fetching (once per run; a second call while it runs does nothing)."""
        with self._cond:
            if self._thread is not None:
                return
            self._started_at = time.perf_counter()
            self._thread = threading.Thread(
                target=self._run, name=f"sakura-feed-{self.manifest.template_id}", daemon=True
            )
            self._thread.start()

    # ---- the forward's side ---------------------------------------------------------------------------------------
    def kv(
        self, step: int, layer: int, *, check: Callable[[], None] | None = None, poll_s: float = 0.1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` at ``step`` (0 in single mode), each float16 (tokens, heads, head_dim); waits until
        decoded, calling ``check()`` every ``poll_s`` (the host's interrupt test); re-raises the fetch's error."""
        step = step if self.steps > 1 else 0
        key = (step, layer)
        t0 = None
        with self._cond:
            while key not in self._layers:
                if self._error is not None:
                    raise RuntimeError(f"template {self.manifest.template_id}: fetch failed: {self._error}") from (
                        self._error
                    )
                if self._finished or self._thread is None:
                    raise RuntimeError(
                        f"template {self.manifest.template_id}: layer {layer} of step {step} was not "
                        "fetched (the feed was not started or was reset)"
                    )
                t0 = t0 or time.perf_counter()
                self._cond.wait(poll_s)
                if check is not None:
                    self._cond.release()
                    try:
                        check()
                    finally:
                        self._cond.acquire()
            if t0 is not None:
                self.stats.wait_s += time.perf_counter() - t0
                self.stats.waits += 1
            return self._layers[key]

    # ---- the worker ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._fetch_all())
        except BaseException as e:  # handed to the forward, which raises it in the sampler's thread
            logger.warning("template %s: fetch failed: %s", self.manifest.template_id, e)
            with self._cond:
                self._error = e
                self._cond.notify_all()
        finally:
            with self._cond:
                self._finished = True
                self.stats.done_s = time.perf_counter() - self._started_at
                self._cond.notify_all()

    async def _fetch_all(self) -> None:
        decoded: dict[tuple[int, int], tuple] = {}  # (step, first layer) -> fp16 numpy K, V (residual references)
        async with self.source.open() as shards:
            for shard in self.manifest.shards:
                with self._cond:
                    if self._stop:
                        return
                step, first = shard.step or 0, shard.layers[0]
                rep = self._representation(shard)
                ref = rep.ref
                if ref is not None and ref.mode == "reuse":
                    k, v = decoded[(ref.step, first)]
                else:
                    blobs = []
                    for digest in rep.chain_digests:
                        blobs.append(await shards.fetch_shard(digest))
                        self.stats.bytes += len(blobs[-1])
                    reference = None
                    if ref is not None:
                        rk, rv = decoded[(ref.step, first)]
                        reference = DecodedReference(ref.step, ref.digest, rk, rv)
                    _, k, v = decode_chain(blobs, reference)  # (layers_in_shard, tokens, heads, head_dim) fp16
                decoded[(step, first)] = (k, v)
                self._publish(step, first, k, v)

    def _representation(self, shard: Shard) -> Representation:
        for rep in shard.representations:
            if rep.name == self.representation:
                return rep
        names = ", ".join(r.name for r in shard.representations)
        raise ValueError(
            f"template {self.manifest.template_id} has no representation {self.representation!r} of "
            f"layers {list(shard.layers)} (it has: {names}); a 'serving' store keeps no fp16"
        )

    def _publish(self, step: int, first: int, k, v) -> None:
        with self._cond:
            for i in range(k.shape[0]):
                self._layers[(step, first + i)] = (torch.from_numpy(k[i].copy()), torch.from_numpy(v[i].copy()))
            self.stats.shards += 1
            if self.stats.first_layer_ready_s is None:
                self.stats.first_layer_ready_s = time.perf_counter() - self._started_at
            self._cond.notify_all()
