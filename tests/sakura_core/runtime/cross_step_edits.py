"""What the live tests of cross-step per-step templates share: a demo template precomputed per step (random
weights), a policy fetching fixed levels, and a pipelined edit of it on a constant link."""

import asyncio
import dataclasses

from sakura_core.fetch.traces import Trace
from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.policy.ladder import rungs_with_track_floor
from sakura_core.policy.plan import FetchPlan, plan_fetch
from sakura_core.policy.policies import LEVEL_COMPUTE, Decision, Policy
from sakura_core.precompute import precompute_template
from sakura_core.runtime.lane_parts import EditInputs
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import LiveSettings, RuntimeConfig, run_pipelined_edit

from .fetchers import blob_fetcher


def cross_step_setup(template_id: str, steps: int):
    """(model, template image, user image, precomputed per-step template, live profile) for ``steps`` steps."""
    model = load_demo_model(weights=None)
    size = model.spec.image_size
    tpl, usr = load_image("astronaut", size), load_image("chelsea", size)
    pre = precompute_template(
        model, tpl, template_id, held_out_probes=1, psnr_steps=1, kv_mode="per-step", steps=steps
    )
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=model.adapter.num_layers, steps=steps)
    return model, tpl, usr, pre, profile


class StepLevels(Policy):
    """Fetch step s's shards at ladder index ``levels[s]`` (one int: every step); the device computes layers
    < ``splits[s]``."""

    family = "sakura"

    def __init__(self, levels, splits):
        self.levels, self.splits = levels, splits

    def choose(self, ctx, g):
        step = ctx.step_of(g)
        if ctx.layer_of(g) < self.splits[step]:
            return Decision(LEVEL_COMPUTE, "the device computes it")
        return Decision(self.levels if isinstance(self.levels, int) else self.levels[step], "fixed level")

    def keep_template(self, ctx, g):
        return ctx.layer_of(g) < self.splits[ctx.step_of(g)]


def run_levels(setup, policy, steps: int, swap=None, open_floor=None, chunks=False, **config):
    """The pipelined edit of ``setup``'s template with ``policy`` at 50 Mbit/s, no upgrades. ``swap``: digest ->
    the digest whose blob is served instead; ``open_floor``: the levels below it fetch their closed-loop twins on
    their track (else ``open_floor``), whatever the random-weight template's PSNRs. ``chunks``: the fetcher reports
    its chunks and awaits its wire turns (as ShardClient does: requests may go ahead)."""
    model, tpl, usr, pre, profile = setup
    plan = plan_fetch(pre.manifest, "sakura")
    if open_floor is not None:
        plan = dataclasses.replace(plan, rungs=rungs_with_track_floor(plan.rungs, open_floor))
    swap = swap or {}

    fetch_blob = blob_fetcher(lambda digest: pre.blobs[swap.get(digest, digest)], chunks)

    return asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            pre.manifest,
            fetch_blob,
            FetchPlan(policy, plan.rungs, plan.floor),
            profile,
            trace=Trace.constant(50.0),
            config=RuntimeConfig(upgrades=False, **config, live=LiveSettings(steps=steps)),
        )
    )
