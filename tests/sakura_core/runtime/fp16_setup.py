"""The demo template precomputed once and reduced to a one-level ladder of its fp16 rung (fetch-fp16's
deterministic decisions), with a fixed live profile: what the live pipeline tests run an edit on."""

from sakura_core.models.edit_model import load_image
from sakura_core.policy.ladder import rungs_from_manifest
from sakura_core.precompute import precompute_template
from sakura_core.runtime.live_profile import LiveProfile


def fp16_only_setup(model, template, steps: int) -> tuple:
    """(model, template, user image, precompute result, rungs, profile); one rung per shard: fp16."""
    usr = load_image("chelsea", model.spec.image_size)
    pre = precompute_template(model, template, "tpl", held_out_probes=1)
    rungs = rungs_from_manifest(pre.manifest, 6e8)
    idx = [r.level.name for r in rungs[0]].index("fp16")  # fetch-fp16 fetches level 0: keep only fp16
    rungs = [[lad[idx]] for lad in rungs]
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=model.adapter.num_layers, steps=steps)
    return model, template, usr, pre, rungs, profile
