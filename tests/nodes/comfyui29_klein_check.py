"""Run inside a real ComfyUI 0.29 (its Python, cwd = ComfyUI): the Sakura Template KV patch on ComfyUI's own FLUX.2
[klein] forward, compared with ComfyUI computing the reference tokens with the KV-mode semantics. Prints one JSON.

    cd $COMFYUI_DIR && $COMFYUI_PYTHON REPO/tests/nodes/comfyui29_klein_check.py --repo REPO --unet U --other-unet U2
        --store S --template ID --inputs INPUTS.safetensors

``INPUTS``: ``ref`` (1, 128, h, w) the template's reference latent (sakura's packed tokens), ``context`` (1, T, C) a
prompt embedding, ``noise`` (1, 128, H, W). Used by ``test_comfyui29_klein.py``; the pack is loaded as ComfyUI loads
a custom-node folder (the repository root as a package).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import sys
from pathlib import Path


def _args():
    p = argparse.ArgumentParser()
    for name in ("--repo", "--unet", "--other-unet", "--store", "--template", "--inputs"):
        p.add_argument(name, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--per-step-template", default=None, help="a per-step template of the same model and image")
    p.add_argument("--lossy-template", default=None, help="a single-mode template with a lossy ladder (same model)")
    return p.parse_args()


ARGS = _args()
sys.argv = [sys.argv[0], "--cpu"]  # ComfyUI parses its own flags at import
sys.path.insert(0, str(Path.cwd()))

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()  # as main.py does, so --cpu applies
import comfy.model_management  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.sd  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def _pack():
    """The repository root imported as ComfyUI imports a custom-node folder."""
    repo = Path(ARGS.repo)
    spec = importlib.util.spec_from_file_location(
        "sakura_pack", repo / "__init__.py", submodule_search_locations=[str(repo)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["sakura_pack"] = module
    spec.loader.exec_module(module)
    import sakura_pack.nodes.template_kv_patch as patch

    return patch


def _handle(store: str, template_id: str):
    from sakura_pack.nodes._stream import TemplateHandle

    from sakura_core.fetch.sources import StoreSource

    async def manifest():
        async with StoreSource(store).open() as shards:
            return await shards.get_manifest(template_id)

    m = asyncio.run(manifest())
    return TemplateHandle(template_id=template_id, model_id=m.model_id, source=StoreSource(store), manifest=m)


def _sample(model, inputs, with_ref: bool, steps: int):
    cond = {"reference_latents": [inputs["ref"]]} if with_ref else {}
    positive = [[inputs["context"], cond]]
    negative = [[torch.zeros_like(inputs["context"]), {}]]
    latent = torch.zeros_like(inputs["noise"])
    return comfy.sample.sample(
        model, inputs["noise"], steps, 1.0, "euler", "simple", positive, negative, latent, denoise=1.0, seed=0
    ).float()


def _sample_sigmas(model, inputs, sigmas: list[float]):
    """SamplerCustom's path: euler on the given sigmas (a per-step template's own schedule)."""
    import comfy.samplers

    positive = [[inputs["context"], {"reference_latents": [inputs["ref"]]}]]
    negative = [[torch.zeros_like(inputs["context"]), {}]]
    return comfy.sample.sample_custom(
        model,
        inputs["noise"],
        1.0,
        comfy.samplers.sampler_object("euler"),
        torch.tensor(sigmas),
        positive,
        negative,
        torch.zeros_like(inputs["noise"]),
        seed=0,
    ).float()


def _per_step(patch, model, inputs, template_id: str) -> dict:
    """A per-step template: fetched vs computed on its own schedule; another schedule refused by name."""
    handle = _handle(ARGS.store, template_id)
    sigmas = [*handle.manifest.schedule.timesteps, 0.0]
    fetched = patch.SakuraTemplateKV.execute(model, handle, patch.FETCHED, "fp16").result[0]
    computed = patch.SakuraTemplateKV.execute(model, handle, patch.COMPUTE, "fp16").result[0]
    out = {"sigmas": sigmas}
    out["fetched_vs_computed"] = _compare(
        _sample_sigmas(fetched, inputs, sigmas), _sample_sigmas(computed, inputs, sigmas)
    )
    try:
        _sample(fetched, inputs, True, ARGS.steps + 1)
        out["other_schedule_error"] = None
    except patch.SakuraNodeError as e:
        out["other_schedule_error"] = str(e)
    return out


# (policy, link, with a ReferenceLatent): the fetch lanes' runs, each compared with ComfyUI computing the references
POLICY_RUNS = (
    ("on-device", "fixed:1000", True),
    ("fetch-fp16", "fixed:1000", True),
    ("sakura", "fixed:0.5", True),
    ("sakura", "fixed:1000", False),
)


def _policies(patch, model, inputs, handle, computed) -> list[dict]:
    """The patch with a Bandwidth-Adaptive Fetch's settings: each policy's edit vs the computed one, its report."""
    from sakura_pack.nodes._stream import KVStream

    from sakura_core.edit_settings import FetchSettings

    out = []
    for policy, link, with_ref in POLICY_RUNS:
        stream = KVStream(handle, FetchSettings(policy=policy, link=link))
        m = patch.SakuraTemplateKV.execute(model, handle, patch.FETCHED, "fp16", kv_stream=stream).result[0]
        image = _sample(m, inputs, with_ref, ARGS.steps)
        report = json.loads(patch.SakuraTemplateKVReport.execute(m, {"samples": image}).result[0])
        out.append(
            {
                "policy": policy,
                "link": link,
                "reference_latent": with_ref,
                "vs_computed": _compare(image, computed),
                "report": {
                    k: report[k]
                    for k in (
                        "policy",
                        "split_layer",
                        "levels_used",
                        "bytes_fetched",
                        "bytes_used",
                        "waits",
                        "computed_here",
                        "fallbacks",
                    )
                },
            }
        )
    return out


def _lossy(patch, model, inputs, template_id: str) -> list[dict]:
    """Each lossy level of a template fetched for every shard: the edit vs the fp16 one, and the manifest's PSNR."""
    handle = _handle(ARGS.store, template_id)
    exact = _sample(
        patch.SakuraTemplateKV.execute(model, handle, patch.FETCHED, "fp16").result[0], inputs, False, ARGS.steps
    )
    out = []
    for rep in handle.manifest.to_json()["shards"][0]["representations"]:
        if rep["name"] == "fp16" or rep.get("psnr_db") is None or "ref" in rep:
            continue
        m = patch.SakuraTemplateKV.execute(model, handle, patch.FETCHED, rep["name"]).result[0]
        out.append(
            {
                "level": rep["name"],
                "manifest_psnr_db": rep["psnr_db"],
                "vs_fp16": _compare(_sample(m, inputs, False, ARGS.steps), exact),
            }
        )
    from sakura_pack.nodes._stream import KVStream

    from sakura_core.edit_settings import FetchSettings

    stream = KVStream(handle, FetchSettings(policy="sakura", link="fixed:1000"))  # the policy over the same ladder
    m = patch.SakuraTemplateKV.execute(model, handle, patch.FETCHED, "fp16", kv_stream=stream).result[0]
    image = _sample(m, inputs, False, ARGS.steps)
    report = json.loads(patch.SakuraTemplateKVReport.execute(m, {"samples": image}).result[0])
    psnr = {r["name"]: r.get("psnr_db") for r in handle.manifest.to_json()["shards"][0]["representations"]}
    out.append(
        {
            "level": "sakura policy",
            "levels_used": report["levels_used"],
            "manifest_psnr_db": psnr,
            "vs_fp16": _compare(image, exact),
        }
    )
    return out


def _id_cost(patch, model) -> dict:
    """Seconds for the model id: hashed (a cold cache) and cached (the same loaded weights again)."""
    import time

    patch.MODEL_IDS._ids.clear()
    patch.MODEL_IDS.hashes = 0
    t0 = time.perf_counter()
    patch.comfy_model_key(model)
    t1 = time.perf_counter()
    patch.comfy_model_key(model)
    t2 = time.perf_counter()
    return {"hashed_s": t1 - t0, "cached_s": t2 - t1, "hashes": patch.MODEL_IDS.hashes}


def _compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    diff = (a - b).abs()
    peak = float(b.abs().max())
    mse = float((diff**2).mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)
    return {"max_abs": float(diff.max()), "psnr_db": psnr if math.isfinite(psnr) else "inf", "peak": peak}


def main() -> None:
    patch = _pack()
    from comfy_extras.nodes_flux import FluxKVCache

    inputs = load_file(ARGS.inputs)
    model = comfy.sd.load_diffusion_model(ARGS.unet)
    handle = _handle(ARGS.store, ARGS.template)
    out: dict = {"comfyui_dtype": str(next(model.model.diffusion_model.parameters()).dtype)}
    out["model_id"] = patch.comfy_model_key(model).model_id
    out["template_model_id"] = handle.manifest.model_id
    fetched = patch.SakuraTemplateKV.execute(model, handle, patch.FETCHED, "fp16").result[0]
    computed = patch.SakuraTemplateKV.execute(model, handle, patch.COMPUTE, "fp16").result[0]
    flux_kv = FluxKVCache.execute(model).result[0]
    runs = {
        "fetched": _sample(fetched, inputs, True, ARGS.steps),
        "fetched_no_reference_latent": _sample(fetched, inputs, False, ARGS.steps),
        "computed": _sample(computed, inputs, True, ARGS.steps),
        "fluxkvcache": _sample(flux_kv, inputs, True, ARGS.steps),
        "native_index": _sample(model, inputs, True, ARGS.steps),
    }
    out["fetched_vs_computed"] = _compare(runs["fetched"], runs["computed"])
    out["fetched_without_ref_vs_computed"] = _compare(runs["fetched_no_reference_latent"], runs["computed"])
    out["fluxkvcache_vs_computed"] = _compare(runs["fluxkvcache"], runs["computed"])
    out["native_index_vs_computed"] = _compare(runs["native_index"], runs["computed"])
    if ARGS.per_step_template:
        out["per_step"] = _per_step(patch, model, inputs, ARGS.per_step_template)
    out["policies"] = _policies(patch, model, inputs, handle, runs["computed"])
    if ARGS.lossy_template:
        out["lossy"] = _lossy(patch, model, inputs, ARGS.lossy_template)
    out["model_id_cost"] = _id_cost(patch, model)
    out["model_options_after"] = sorted(model.model_options.get("transformer_options", {}).get("patches", {}))
    other = comfy.sd.load_diffusion_model(ARGS.other_unet)
    try:
        patch.SakuraTemplateKV.execute(other, handle, patch.FETCHED, "fp16")
        out["mismatch_error"] = None
    except patch.SakuraNodeError as e:
        out["mismatch_error"] = str(e)
    print("RESULT " + json.dumps(out))  # noqa: T201 (a script whose output the test reads)


if __name__ == "__main__":
    main()
