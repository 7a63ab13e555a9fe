"""Late shards in :class:`~sakura_core.runtime.pipeline.PipelinedEdit`'s compute lane: waiting for a shard (a stall,
counted in ``LiveState.stalled_s``), asking the policy every cached-layer time whether the device is sooner
(``recompute_late``, as in the simulator), giving up on the link for the step, and the template KV the device then
computes — the template pass resumed where the step dropped the template tokens (``on_drop`` kept their state).
"""

from __future__ import annotations

import asyncio
import threading

import torch

from .deferral import LATE_FALLBACK_REASON
from .pipeline_config import Cancelled

__all__ = ["LateShards"]


def _wait_or_cancel(ready: threading.Event, cancel: threading.Event, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait up to ``timeout_s`` for ``ready``, returning early (False) once ``cancel`` is set."""
    waited = 0.0
    while not cancel.is_set() and waited < timeout_s:
        step = min(poll_s, timeout_s - waited)
        if ready.wait(step):
            return True
        waited += step
    return ready.is_set()


class LateShards:
    """Mixin: the late-shard half of a pipelined edit's compute lane (state lives on the edit: ``st``, ``ctx``,
    ``policy``, ``ready``, ``failed``, ``deferred``, ``dropped``, ``fallback_kv``, ``backend``, ...)."""

    def wait_for_shard(self, layer: int, step: int) -> None:
        """Block the compute lane until ``layer``'s shard is ready (a stall in the timeline) or give up on it: every
        cached-layer time of waiting the policy is asked whether a template pass on the device is sooner
        (``recompute_late``, as in the simulator); after ``shard_wait_s`` the device computes it regardless."""
        st = self.st
        with st.lock:
            skipped = layer not in st.in_flight and not st.got.get(layer) and (st.base_done or st.next_layer > layer)
            if skipped and layer in self.deferred:
                self.deferred.remove(layer)
        if skipped:  # the fetch lane skipped it (a policy may not foresee a drop) — fetch it now at the floor
            asyncio.run_coroutine_threadsafe(self.fetch_with_fallback(layer, self.floor), self._loop)
        t0 = st.now
        with st.lock:
            st.waiting_since = t0
        try:
            self._wait_or_give_up(layer, step, t0)
        finally:
            with st.lock:
                st.stalls_done_s += st.now - t0
                st.waiting_since = None
        self.event("stall", t0, st.now, layer, f"step {step}")

    def _wait_or_give_up(self, layer: int, step: int, t0: float) -> None:
        """The waiting of :meth:`wait_for_shard`: until the shard is ready, the policy gives up on it, or timeout."""
        st = self.st
        poll = min(max(self.profile.layer_cached_s, 0.01), self.cfg.shard_wait_s)
        while not _wait_or_cancel(self.ready[layer], self.cancel, min(poll, t0 + self.cfg.shard_wait_s - st.now)):
            if self.cancel.is_set():
                raise Cancelled(f"edit cancelled at step {step}, layer {layer} while waiting for its shard")
            if st.now - t0 >= self.cfg.shard_wait_s:
                self.fallbacks.append(
                    f"shard {layer} not ready after {self.cfg.shard_wait_s}s; computing it on the device"
                )
                self.failed.add(layer)
                break
            with st.lock:
                st.compute_t = st.now
                late = self.policy.recompute_late(self.ctx, layer)
            if late:
                self._give_up_on_link(layer, step)
                break

    def _give_up_on_link(self, layer: int, step: int) -> None:
        """The policy says a template pass on the device is sooner than waiting: every shard of this step (every
        shard in single mode) not decoded yet is computed on the device, and the fetch lane moves on to the next
        step."""
        st = self.st
        end = (step + 1) * self.L if self.per_step else self.N
        self.decisions.append({"t": st.now, "layer": layer, "level": "device",
                               "reason": LATE_FALLBACK_REASON})  # fmt: skip
        self.fallbacks.append(f"shard {layer} late: the device computes the template KV of "
                              f"{f'step {step}' if self.per_step else 'every layer'} (policy: sooner than waiting)")  # fmt: skip
        with st.lock:
            for g in range(layer, end):
                if not self.ready[g].is_set():
                    self.failed.add(g)
            st.next_layer = max(st.next_layer, end)
            self.deferred = [g for g in self.deferred if g >= end]

    def device_kv(self, g: int):
        """Shard ``g``'s template KV computed on the device: one template-only pass serves every layer of its step
        (at that step's own time, in per-step mode) — resumed where the step dropped the template tokens, from their
        hidden state there, so the layers the device already ran are not run again."""
        if g not in self.fallback_kv:
            step = g // self.L if self.per_step else 0
            t0 = self.st.now
            ref_t = float(self.times[step]) if self.per_step else None
            grid = self.model.template_grid(self.template_image)
            start, hidden = self.dropped.get(step, (0, None))
            if hidden is not None and start <= g % self.L:
                kv = self.backend.resume_template_kv(hidden, grid, start, ref_t)
            else:
                start = 0
                tokens = self.model.template_tokens(self.template_image)
                tkv = self.backend.extract_template_kv(tokens, grid, ref_t)
                kv = [tkv.layer(i) for i in range(self.L)]
            what = f"fallback template pass from layer {start}" + (f" (step {step})" if self.per_step else "")
            self.event("compute", t0, self.st.now, -1, what)
            with self.st.lock:
                for x, layer_kv in enumerate(kv, start=step * self.L + start):
                    if x >= self.released_below:  # not a layer the compute lane has passed
                        self.fallback_kv[x] = layer_kv
                        self._count_kv(added=layer_kv)
        return self.fallback_kv[g]

    def _on_drop(self, step: int, layer: int, hidden: torch.Tensor) -> None:
        """The compute lane dropped the template tokens before ``layer``: keep their state for a fallback pass."""
        self.dropped[max(step, 0) if self.per_step else 0] = (layer, hidden)
