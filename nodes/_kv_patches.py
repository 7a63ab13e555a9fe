"""What the Sakura Template KV node attaches to a cloned MODEL: the per-run state (:class:`RunState`) and the patch
callables ComfyUI's FLUX forward calls (``attn1_patch``, ``post_input``, ``patches_replace["dit"]`` blocks and the
``OUTER_SAMPLE`` wrapper). ``nodes/template_kv_patch.py`` holds the node and explains the modes.

With fetch settings (a Sakura Bandwidth-Adaptive Fetch connected) a run is served by the runtime's lanes
(``sakura_core.runtime.host_lanes.HostLanes``: the policy picks each shard's level from the measured link); while a
``ReferenceLatent``'s tokens are in step 0's sequence of a single-mode template, :class:`SplitBlock` asks the policy
per layer whether ComfyUI computes that layer's reference tokens (KV-mode semantics; their K/V kept for later steps)
or drops them there (the hybrid split; later layers slice them out of the block's input and use fetched K/V).
Without fetch settings one representation is fetched for every shard (``sakura_core.template_feed``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from ._common import SakuraNodeError

if TYPE_CHECKING:
    from sakura_core.runtime.host_lanes import HostLanes
    from sakura_core.template_feed import TemplateKVFeed

__all__ = ["DropReferences", "RunState", "SampleWrapper", "SelfOnlyReferences", "SplitBlock", "TemplateAttention"]

logger = logging.getLogger(__name__)


def _ref_tokens(options: dict) -> int:
    return int(sum(options.get("reference_image_num_tokens", []) or []))


def self_only_mask(q: torch.Tensor, n: int, attn_mask) -> torch.Tensor:
    """Additive (1, 1, L, L) mask keeping the last ``n`` (reference) queries on the reference keys."""
    length = q.shape[2]
    mask = torch.zeros(1, 1, length, length, dtype=q.dtype, device=q.device)  # (B, H, L_q, L_k) additive
    mask[..., length - n :, : length - n] = float("-inf")
    if attn_mask is not None:
        mask = mask + (attn_mask if attn_mask.dtype != torch.bool else torch.where(attn_mask, 0.0, float("-inf")))
    return mask


class RunState:
    """One sampling run of a patched MODEL: its fetch (lanes with settings, else a one-representation feed), the
    step, whether the reference tokens ride in the sequence (the split), the progress bar; :meth:`reset` in
    ``finally``. ``last_report``: the previous run's report (the Template KV Report node shows it)."""

    def __init__(self, handle, representation: str, settings, num_double: int, layers: int):
        self.handle, self.representation, self.settings = handle, representation, settings
        self.num_double, self.layers = num_double, layers
        self.last_report: dict | None = None
        self.feed: TemplateKVFeed | None = None  # the one-representation feed (no fetch settings)
        self.lanes: HostLanes | None = None  # the runtime's lanes (with a Bandwidth-Adaptive Fetch's settings)
        self.pbar: Any = None  # comfy.utils.ProgressBar while a forward waits
        self.prior_layer_s: float | None = None  # the last run's measured layer time: the next run's prior
        self.reset()

    # ---- lifetime
    def begin(self, sigmas) -> None:
        self.reset()
        self.sigmas = [float(s) for s in sigmas]
        if self.settings is None:
            from sakura_core.template_feed import TemplateKVFeed

            self.feed = TemplateKVFeed(self.handle.source, self.handle.manifest, self.representation)
            self.feed.start()

    def _start_lanes(self, refs_in_sequence: bool) -> None:
        from sakura_core.runtime.host_lanes import PRIOR_LAYER_S, HostLanes
        from sakura_core.runtime.pipeline_config import LiveSettings, RuntimeConfig

        s = self.settings
        try:
            steps = max(len(self.sigmas) - 1, 1)
            config = RuntimeConfig(latency_target_s=s.latency_target_s, live=LiveSettings(steps=steps))
            self.lanes = HostLanes(
                self.handle.source,
                self.handle.manifest,
                s.policy,
                s.link,
                self.layers,
                config,
                prior_layer_s=self.prior_layer_s or PRIOR_LAYER_S,
            )
        except ValueError as e:
            raise SakuraNodeError(f"template {self.handle.template_id!r}: {e}") from e
        self.carry = refs_in_sequence and self.handle.kv_mode == "single"
        self.lanes.start(self.carry)

    def reset(self) -> None:
        if self.feed is not None:
            logger.info("Sakura Template KV %s: %s", self.handle.template_id, self.feed.stats.summary())
            self.last_report = {"template_id": self.handle.template_id, **self.feed.stats.summary()}
            self.feed.reset()
        if self.lanes is not None:
            self.last_report = self.lanes.report()
            logger.info(
                "Sakura Template KV %s: %s",
                self.handle.template_id,
                {k: self.last_report[k] for k in ("policy", "bytes_fetched", "split_layer", "wait_s")},
            )
            self.prior_layer_s = self.lanes.st.profile.layer_cached_s
            self.lanes.reset()
        self.feed = self.lanes = None
        self.sigmas = []
        self.carry = False  # the reference tokens ride in step 0's sequence (lanes, single mode, ReferenceLatent)
        self.computing = False  # the layer running now computes the reference tokens (before the split)
        self.on_device: dict = {}  # single mode: (layer, device, dtype) -> (source K, (K, V) (1, H, T, D) moved)
        self.pbar = None
        self.step = 0  # the step of the forward running now (post_input sets it from the sampler's sigma)
        self.refs_now = 0  # reference tokens in that forward's sequence (step 0 before the split)

    # ---- the forward's side
    def step_of(self, sigma: float) -> int:
        from sakura_core.template_feed import step_of_sigma

        if self.handle.kv_mode == "per-step":
            try:
                return step_of_sigma(sigma, self.handle.manifest.schedule.timesteps)
            except ValueError as e:
                raise SakuraNodeError(f"template {self.handle.template_id!r}: {e}") from e
        if self.sigmas and abs(sigma - self.sigmas[0]) <= 1e-6:
            return 0
        return 1  # single mode: one KV for every step; > 0 = after step 0's split

    def check(self) -> None:
        """While the forward waits for a shard: Cancel, and ComfyUI's progress bar shows the fetch."""
        import comfy.model_management
        import comfy.utils

        comfy.model_management.throw_exception_if_processing_interrupted()
        if self.lanes is not None:
            done, total = self.lanes.shards_done(), len(self.lanes.grid)
        else:
            assert self.feed is not None  # begin() made it: no lanes, so the one-representation feed
            done, total = self.feed.stats.shards, len(self.handle.loaded_manifest.shards)
        if self.pbar is None:
            self.pbar = comfy.utils.ProgressBar(total)
        self.pbar.update_absolute(done, total)

    def device_kv(self, step: int, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's template K/V as (1, heads, tokens, head_dim) on ``like``'s device and in its dtype."""
        if self.lanes is not None:  # asked at every step: an upgrade that arrived meanwhile is used
            k, v = self.lanes.kv(step, layer, check=self.check)  # (tokens, heads, head_dim)
        else:
            assert self.feed is not None  # begin() made it: no lanes, so the one-representation feed
            k, v = self.feed.kv(step, layer, check=self.check)  # the same tensors for every step in single mode
        key = (layer, like.device, like.dtype)
        held = self.on_device.get(key)
        if held is not None and held[0] is k:  # single mode: moved once per run and level (the source kept alive)
            return held[1]
        k_on, v_on = (t.to(like.device, like.dtype).permute(1, 0, 2).unsqueeze(0) for t in (k, v))
        kv = (k_on, v_on)
        if self.handle.kv_mode == "single":
            self.on_device[key] = (k, kv)
        return kv


class SampleWrapper:
    """OUTER_SAMPLE wrapper: the run begins with the sampler's sigmas and is reset in ``finally``."""

    def __init__(self, state: RunState):
        self.state = state

    def __call__(self, executor, *args, **kwargs):
        sigmas = kwargs["sigmas"] if "sigmas" in kwargs else args[3]
        self.state.begin(sigmas)
        try:
            return executor(*args, **kwargs)
        finally:
            self.state.reset()


class DropReferences:
    """post_input patch (fetched mode): drop ComfyUI's reference tokens (the template holds their K/V) after checking
    that they are as many as the template's — except in step 0 of a run whose policy splits (they ride along until
    the split)."""

    def __init__(self, state: RunState, template_tokens: int):
        self.state, self.template_tokens = state, template_tokens

    def __call__(self, inputs: dict) -> dict:
        st = self.state
        n = _ref_tokens(inputs["transformer_options"])
        if n and n != self.template_tokens:
            raise SakuraNodeError(
                f"the conditioning's reference latents make {n} tokens, template "
                f"{st.handle.template_id!r} holds {self.template_tokens}: use the reference image "
                "the template was made from at its size, or drop the ReferenceLatent node (the "
                "template is the reference)"
            )
        if st.settings is not None and st.lanes is None:
            st._start_lanes(refs_in_sequence=n > 0)
        sigma = float(inputs["transformer_options"]["sigmas"].flatten()[0])
        st.step = st.step_of(sigma)
        st.refs_now = n if (st.carry and st.step == 0) else 0
        if n == 0 or st.refs_now:
            return inputs
        inputs["img"] = inputs["img"][:, :-n]
        inputs["img_ids"] = inputs["img_ids"][:, :-n]
        return inputs


class SplitBlock:
    """``patches_replace["dit"]`` block (lanes mode): before the split the block runs with the reference tokens
    (ComfyUI computes them); from the split on, they are sliced out of its input (sequence and RoPE) and put back
    unchanged after it. Times each layer for the policy."""

    def __init__(self, state: RunState, block_type: str, index: int):
        self.state, self.block_type, self.index = state, block_type, index

    def __call__(self, args: dict, extra: dict) -> dict:
        from sakura_core.template_feed import layer_index

        st, original = self.state, extra["original_block"]
        lanes, n = st.lanes, st.refs_now
        if lanes is None:
            return original(args)
        layer = layer_index(self.block_type, self.index, st.num_double)
        lanes.at_layer(st.step, layer)
        t0, waited = time.perf_counter(), lanes.wait_s
        st.computing = bool(n) and lanes.keep_template(layer)
        if not n or st.computing:
            out = original(args)
        else:
            cut = dict(args, img=args["img"][:, :-n], pe=args["pe"][:, :, :-n])  # (B, L, C); pe (B, 1, L, ...)
            out = original(cut)
            out["img"] = torch.cat([out["img"], args["img"][:, -n:]], dim=1)  # the references, unchanged
        compute_s = time.perf_counter() - t0 - (lanes.wait_s - waited)  # a wait for the shard is no compute time
        lanes.layer_time(max(compute_s, 0.0), with_template=st.computing)
        return out


class TemplateAttention:
    """attn1 patch (fetched mode): append the template's K/V of this layer (and step) to every attention; before
    the split (lanes mode) keep the reference queries on the reference keys and hand their K/V to the lanes."""

    def __init__(self, state: RunState):
        self.state = state

    def __call__(self, q, k, v, pe=None, attn_mask=None, extra_options=None, **kwargs):
        from comfy.ldm.flux.math import apply_rope

        from sakura_core.template_feed import layer_index

        st = self.state
        if st.feed is None and st.settings is None or st.settings is not None and st.lanes is None:
            raise SakuraNodeError("Sakura Template KV: the model ran outside a sampler run (no fetch started)")
        layer = layer_index(extra_options["block_type"], extra_options["block_index"], st.num_double)
        if pe is not None:  # the template's keys are stored after RoPE: rotate the request's here, none later
            q, k = apply_rope(q, k, pe)
        if st.computing:  # ComfyUI computes this layer's reference tokens: KV-mode mask; keep their K/V
            n = st.refs_now
            st.lanes.hold_computed(layer, k[0, :, -n:].permute(1, 0, 2), v[0, :, -n:].permute(1, 0, 2))
            return {"q": q, "k": k, "v": v, "pe": None, "attn_mask": self_only_mask(q, n, attn_mask)}
        kt, vt = st.device_kv(st.step if st.handle.kv_mode == "per-step" else 0, layer, k)
        batch = q.shape[0]
        kt, vt = kt.expand(batch, -1, -1, -1), vt.expand(batch, -1, -1, -1)  # (B, H, T, D)
        if attn_mask is not None:
            pad = torch.zeros(*attn_mask.shape[:-1], kt.shape[2], dtype=attn_mask.dtype, device=attn_mask.device)
            attn_mask = torch.cat([attn_mask, pad if attn_mask.dtype != torch.bool else ~pad], dim=-1)
        return {
            "q": q,
            "k": torch.cat([k, kt], dim=2),
            "v": torch.cat([v, vt], dim=2),
            "pe": None,
            "attn_mask": attn_mask,
        }


class SelfOnlyReferences:
    """attn1 patch (compute mode): reference queries see only reference keys (the KV-mode definition)."""

    def __call__(self, q, k, v, pe=None, attn_mask=None, extra_options=None, **kwargs):
        n = _ref_tokens(extra_options)
        if n == 0:
            return {}
        return {"attn_mask": self_only_mask(q, n, attn_mask)}
