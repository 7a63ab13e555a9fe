"""The Sakura Template KV patch in a real ComfyUI 0.29 on its own FLUX.2 [klein] forward (``COMFYUI_DIR`` and
``COMFYUI_PYTHON``; DEVELOPERS.md says how; CI installs both).

A held-out tiny klein in ComfyUI's file layout (``tiny_klein.COMFYUI_GEOMETRY``: 2 double + 3 single blocks, head_dim
128, a 32-channel latent — sizes ComfyUI's model detection accepts) is precomputed with ``sakura precompute --model
klein-files:...`` (the fp16 codec: the exact KV only, the quickest precompute), single and per-step; ``comfyui29_klein_check.py`` then loads its diffusion model with
ComfyUI's ``load_diffusion_model`` (what ``UNETLoader`` calls) and samples with ``comfy.sample.sample`` (KSampler's
path, euler / simple, 4 steps), reference latent as ``ReferenceLatent`` puts it in the conditioning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ci_deps import require_or_skip

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "")
COMFYUI_PYTHON = os.environ.get("COMFYUI_PYTHON", "")
require_or_skip(
    bool(COMFYUI_DIR and COMFYUI_PYTHON),
    "COMFYUI_DIR / COMFYUI_PYTHON are not set: this test needs ComfyUI 0.29 and its Python (DEVELOPERS.md)",
    allow_module_level=True,
)

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = "tk45-face"
PER_STEP = "tk45-face-steps"
LOSSY = "tk45-face-int4"  # a lossy level (int4) with its manifest PSNR; the sakura ladder's precompute takes minutes
PER_STEP_ARGS = ["--kv-mode", "per-step", "--steps", "4", "--no-compare-single"]
CHECK_TIMEOUT_S = 900


def _files_spec(models: Path, folder: Path, name: str) -> str:
    return (
        f"klein-files:diffusion_model={models}/diffusion_models/{name}.safetensors,text_encoder={models}/"
        f"text_encoders/{name}-qwen3.safetensors,vae={models}/vae/{name}-vae.safetensors,tokenizer={folder}/"
        "tokenizer"
    )


@pytest.fixture(scope="module")
def klein(tmp_path_factory):
    """(files spec, other model's diffusion file, store, inputs file) for the held-out tiny klein."""
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    from sakura_core.models.loading import load_edit_model
    from sakura_core.models.single_file_export import save_single_files
    from sakura_core.models.tiny_klein import COMFYUI_GEOMETRY, build_tiny_klein

    work = tmp_path_factory.mktemp("klein29")
    for seed, name in ((45, "tk45"), (46, "tk46")):
        folder = build_tiny_klein(work / name, seed=seed, geometry=COMFYUI_GEOMETRY)
        save_single_files(folder, work / "models", name=name)
    spec = _files_spec(work / "models", work / "tk45", "tk45")
    image = np.random.default_rng(4).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(image).save(work / "ref.png")
    store = work / "store"
    for template_id, mode in (
        (TEMPLATE, ["--kv-mode", "single", "--codec", "fp16"]),
        (PER_STEP, [*PER_STEP_ARGS, "--codec", "fp16"]),
        (LOSSY, ["--kv-mode", "single", "--codec", "int4"]),
    ):
        subprocess.run([sys.executable, "-m", "sakura_core.cli", "precompute", "--store", str(store), "--model", spec,
                        "--image", str(work / "ref.png"), "--id", template_id, "--store-profile", "full", *mode],
                       check=True, cwd=REPO, timeout=900)  # fmt: skip # keep: flags beside their values
    model = load_edit_model(spec)
    tokens = model.template_tokens(image)  # (1, T, 128) the template pass's reference tokens
    rows, cols = model.template_grid(image)
    gen = torch.Generator().manual_seed(0)
    inputs = {
        "ref": tokens.reshape(1, rows, cols, -1).permute(0, 3, 1, 2).contiguous(),  # (1, 128, rows, cols)
        "context": torch.randn(1, 8, model.adapter.model.config.joint_attention_dim, generator=gen),
        "noise": torch.randn(1, tokens.shape[-1], 4, 4, generator=gen),
    }
    save_file(inputs, str(work / "inputs.safetensors"))
    return {
        "spec": spec,
        "other": work / "models/diffusion_models/tk46.safetensors",
        "store": store,
        "inputs": work / "inputs.safetensors",
        "unet": work / "models/diffusion_models/tk45.safetensors",
        "model_id": model.model_id,
    }


@pytest.fixture(scope="module")
def result(klein, comfyui_python):
    argv = [
        comfyui_python,
        str(REPO / "tests/nodes/comfyui29_klein_check.py"),
        "--repo",
        str(REPO),
        "--unet",
        str(klein["unet"]),
        "--other-unet",
        str(klein["other"]),
        "--store",
        str(klein["store"]),
        "--template",
        TEMPLATE,
        "--inputs",
        str(klein["inputs"]),
        "--per-step-template",
        PER_STEP,
        "--lossy-template",
        LOSSY,
    ]
    proc = subprocess.run(argv, cwd=COMFYUI_DIR, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"check script failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out = json.loads(lines[-1][len("RESULT ") :])
    print(json.dumps(out, indent=1))  # noqa: T201 (the figures, shown with -s)
    return out


def test_comfyui_model_id_is_precompute_model_id(klein, result):
    """The id computed from ComfyUI's loaded state dict is the one `sakura precompute --model klein-files:` gave."""
    assert result["comfyui_dtype"] == "torch.float32"
    assert result["model_id"] == klein["model_id"] == result["template_model_id"]


def test_fetched_fp16_kv_equals_comfyui_computing_the_references(result):
    """ComfyUI's own sampler on the patched MODEL: fetched fp16 template K/V == ComfyUI computing the reference
    tokens with the KV-mode semantics (>= 45 dB, or within 1e-5), with or without a ReferenceLatent."""
    for key in ("fetched_vs_computed", "fetched_without_ref_vs_computed"):
        r = result[key]
        assert r["max_abs"] <= 1e-5 or r["psnr_db"] == "inf" or r["psnr_db"] >= 45.0, (key, r)


def test_per_step_template_follows_the_samplers_sigma(result):
    """A per-step template on its own schedule (SamplerCustom, euler on its sigmas): each step's fetched K/V ==
    ComfyUI computing the references at that step's time; KSampler's other schedule stops naming the sigma."""
    r = result["per_step"]["fetched_vs_computed"]
    assert r["max_abs"] <= 1e-5 or r["psnr_db"] == "inf" or r["psnr_db"] >= 45.0, r
    err = result["per_step"]["other_schedule_error"]
    assert err is not None and PER_STEP in err and "no step of the per-step template's schedule" in err


def test_comfyui_native_reference_attention_differs_from_kv_mode(result):
    """ComfyUI's FluxKVCache and its plain `index` method let reference tokens attend to everything: not the KV-mode
    edit (the difference the patch's compute mode removes; docs/comfyui.md records it)."""
    exact = max(result["fetched_vs_computed"]["max_abs"], 1e-6)
    assert result["fluxkvcache_vs_computed"]["max_abs"] > 20 * exact  # measured 3.1e-4 vs 2.0e-6 (tiny random klein)
    assert result["native_index_vs_computed"]["max_abs"] > 20 * exact  # measured 1.6e-3


def test_template_of_another_model_is_refused_by_name(result):
    err = result["mismatch_error"]
    assert err is not None and TEMPLATE in err and "sakura precompute" in err
    assert result["template_model_id"] in err and "float32" in err  # the template's side and this model's


def test_patch_leaves_the_input_model_unpatched(result):
    assert result["model_options_after"] == []


def _exact(r: dict) -> bool:
    return r["max_abs"] <= 1e-5 or r["psnr_db"] == "inf" or r["psnr_db"] >= 45.0


def test_policies_pick_levels_and_split_and_the_edit_stays_exact(result):
    """With a Bandwidth-Adaptive Fetch's settings the runtime's lanes serve ComfyUI's forward: every policy's edit
    (fp16 store) equals ComfyUI computing the references, wherever its split put the reference tokens; on-device
    computes every layer here at step 0 (nothing fetched), fetch-fp16 fetches every layer, sakura's report shows
    its decisions; the report names what each shard used."""
    runs = {(r["policy"], r["link"], r["reference_latent"]): r for r in result["policies"]}
    layers = 5  # tiny_klein.COMFYUI_GEOMETRY: 2 double + 3 single blocks
    for key, r in runs.items():
        assert _exact(r["vs_computed"]), (key, r)
        assert set(r["report"]["levels_used"]) == {str(g) for g in range(layers)}, (key, r["report"])
    on_device = runs[("on-device", "fixed:1000", True)]["report"]
    assert on_device["split_layer"] == layers and on_device["computed_here"] == list(range(layers))
    assert on_device["bytes_used"] == 0
    fetched = runs[("fetch-fp16", "fixed:1000", True)]["report"]
    assert fetched["split_layer"] == 0 and fetched["computed_here"] == [] and fetched["bytes_used"] > 0
    assert all(used == ["fp16"] * len(used) for used in fetched["levels_used"].values())
    no_ref = runs[("sakura", "fixed:1000", False)]["report"]  # no ReferenceLatent: nothing can be computed here
    assert no_ref["computed_here"] == [] and no_ref["bytes_used"] > 0


def test_lossy_levels_stay_within_their_manifest_psnr(result):
    """Each lossy level of a template fetched for every shard: the edit vs the fp16 edit in ComfyUI is within 2 dB of
    the PSNR the manifest states for that level. The manifest's figure is measured by ``sakura precompute`` on
    sakura's own edit (its prompt, noise and schedule), this one on ComfyUI's euler with another prompt embedding:
    the sakura ladder measured 0.1 to 1.7 dB below its manifest here at l0..l6, above at l3, l7, l8 (docs/comfyui.md)."""
    *fixed, policy = result["lossy"]
    assert fixed, "the lossy template has no lossy level"
    for r in fixed:
        assert r["vs_fp16"]["psnr_db"] == "inf" or r["vs_fp16"]["psnr_db"] >= r["manifest_psnr_db"] - 2.0, r
        assert r["vs_fp16"]["max_abs"] > 0  # the level was really fetched: not the exact edit
    # the sakura policy over the same ladder: levels of it, the edit within 2 dB of the worst level it used
    used = {name for names in policy["levels_used"].values() for name in names}
    assert used and used <= set(policy["manifest_psnr_db"]), policy
    worst = min(policy["manifest_psnr_db"][name] for name in used)
    assert policy["vs_fp16"]["psnr_db"] == "inf" or policy["vs_fp16"]["psnr_db"] >= worst - 2.0, policy


def test_model_id_is_hashed_once_per_loaded_model(result):
    """The second key of the same loaded weights is served from the cache (the seconds are printed, not asserted)."""
    assert result["model_id_cost"]["hashes"] == 1
