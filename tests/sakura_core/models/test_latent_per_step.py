"""Per-step KV mode in latent space: the edit with per-step template KV (one extract per sampler step, the template
modulated with that step's time) equals diffusers' own transformer run with the template tokens at every step
(``kv_cache_mode="extract"``, ``ref_fixed_timestep`` = the step's time) and the pipeline's scheduler."""

from __future__ import annotations

import numpy as np
import torch
from ci_deps import import_or_skip

import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")


def _reference(model, template, start, prompt: str, steps: int) -> torch.Tensor:
    """diffusers components only: the pipeline's prompt embedding, reference latents, ids and scheduler."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import compute_empirical_mu
    from PIL import Image

    pipe, spec = model.pipe, model.spec
    s = spec.image_size
    prompt_embeds, text_ids = pipe.encode_prompt(
        prompt, device="cpu", max_sequence_length=spec.text_tokens, text_encoder_out_layers=spec.text_encoder_layers
    )
    pixels = pipe.image_processor.preprocess(Image.fromarray(template), height=s, width=s, resize_mode="crop")
    ref, ref_ids = pipe.prepare_image_latents([pixels], 1, None, "cpu", pipe.vae.dtype)
    rows, cols = spec.grid
    latents = start.clone()
    latent_ids = pipe._prepare_latent_ids(latents.permute(0, 2, 1).reshape(1, -1, rows, cols))
    mu = compute_empirical_mu(image_seq_len=spec.num_tokens, num_steps=steps)
    pipe.scheduler.set_timesteps(steps, sigmas=model.sigmas_in(steps), mu=mu)
    pipe.scheduler.set_begin_index(0)
    for t in pipe.scheduler.timesteps:
        ts = t.expand(1).to(latents.dtype) / 1000
        noise_pred, _ = pipe.transformer(
            hidden_states=torch.cat([ref, latents], dim=1),
            timestep=ts,
            guidance=None,
            encoder_hidden_states=prompt_embeds,
            txt_ids=text_ids,
            img_ids=torch.cat([ref_ids, latent_ids], dim=1),
            return_dict=False,
            kv_cache_mode="extract",
            num_ref_tokens=ref.shape[1],
            ref_fixed_timestep=float(ts),
        )
        latents = pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
    return latents


@torch.no_grad()
def test_latent_per_step_edit_equals_diffusers(klein_model):
    from sakura_core.runtime.denoise import run_edit

    model = klein_model
    torch.set_num_threads(1)
    size, steps, seed, prompt = model.spec.image_size, 3, 2, "swap the face"
    rng = np.random.default_rng(3)
    template = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    user = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    times = model.schedule(steps)
    kv = model.adapter.extract_per_step_kv(model.template_tokens(template), model.spec.grid, times[:-1])
    ours = run_edit(model, user, prompt, steps=steps, seed=seed, kv_source=kv, kv_mode="per-step").tokens
    u = model.pack_image(user)
    noise = torch.randn(u.shape, generator=torch.Generator().manual_seed(seed))
    start, _ = model.edit_start(u, noise, steps)
    theirs = _reference(model, template, start, prompt, steps)
    diff = float(np.abs(model.decode_float(ours) - model.decode_float(theirs)).max())
    print(f"per-step: max |ours - diffusers| = {diff:.3e} (images in [0, 1])")  # noqa: T201 (-s figure)
    assert diff <= 1e-5
    single = model.adapter.extract_template_kv(model.template_tokens(template), model.spec.grid)
    other = run_edit(model, user, prompt, steps=steps, seed=seed, kv_source=single).tokens
    assert float((other - theirs).abs().max()) > 1e-4  # single-mode KV is another edit: the check can tell
