"""The FLUX.2 [klein] example workflows: ComfyUI 0.29's NATIVE klein nodes (``UNETLoader``, ``CLIPLoader`` type
``flux2``, ``VAELoader``, ``KSampler`` / ``SamplerCustomAdvanced`` + ``Flux2Scheduler``) with the Sakura Template KV
MODEL patch between the loader and the sampler, written in ComfyUI's UI format (``example_workflows/<name>.json``,
what the template browser lists) with a thumbnail (``<name>.jpg``)::

    .venv/bin/python tests/nodes/klein_workflows.py

They need the real klein 4B files (a tiny random klein's Qwen3 / VAE cannot be loaded by ``CLIPLoader`` /
``VAELoader``, docs/comfyui.md), so no test runs them: ``test_klein_workflows.py`` checks them against our nodes'
schemas and ComfyUI's own ``/object_info`` (``ui_schema_check.py``).

The user's image enters as the start of the flow (``VAEEncode`` -> the sampler's latent, ``denoise`` < 1), as
``sakura_core/models/latent_model.py``'s ``edit_start`` does; the template's fetched K/V is the reference (no
``ReferenceLatent``: the patch would take its tokens for the template's own).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace as NS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workflows import OUT, SERVER_URL, Node, completed, sakura_schemas, ui_format  # noqa: E402

UNET = "flux-2-klein-4b.safetensors"
TEXT_ENCODER = "qwen_3_4b.safetensors"
VAE = "flux2-vae.safetensors"
SIZE = 512  # the edit size klein-files precomputes at by default (the token grid and the per-step schedule follow it)
PROMPT_KLEIN = "replace the face in the marked region with the face of the input image"
MODEL_FILES = (".safetensors", ".sft", ".gguf", ".ckpt", ".pt")  # a combo naming one: a model file to download


def _i(name, io_type, default=None, optional=False, options=None, lo=None, hi=None, seed=False):
    return NS(
        id=name,
        io_type=io_type,
        default=default,
        optional=optional,
        options=options,
        min=lo,
        max=hi,
        control_after_generate=seed,
    )


def _o(io_type):
    return NS(display_name=io_type, io_type=io_type)


SAMPLERS = ["euler", "euler_ancestral", "heun", "dpmpp_2m"]
MAX_SEED, MAX_RES = 18446744073709551615, 16384
# ComfyUI 0.29's own nodes used here, as schema-like objects (id, io_type, default, options, min, max) in their input
# order; test_klein_workflows.py checks the workflows against the real ComfyUI's /object_info too
NATIVE = {
    "UNETLoader": ([_i("unet_name", "COMBO", UNET, options=[UNET]),
                    _i("weight_dtype", "COMBO", "default", options=["default", "fp8_e4m3fn", "fp8_e4m3fn_fast",
                                                                     "fp8_e5m2"])], ["MODEL"]),
    "CLIPLoader": ([_i("clip_name", "COMBO", TEXT_ENCODER, options=[TEXT_ENCODER]),
                    _i("type", "COMBO", "flux2", options=["flux2"]),
                    _i("device", "COMBO", "default", optional=True, options=["default", "cpu"])], ["CLIP"]),
    "VAELoader": ([_i("vae_name", "COMBO", VAE, options=[VAE])], ["VAE"]),
    "ImageScale": ([_i("image", "IMAGE"), _i("upscale_method", "COMBO", "lanczos",
                                             options=["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]),
                    _i("width", "INT", SIZE, lo=0, hi=MAX_RES), _i("height", "INT", SIZE, lo=0, hi=MAX_RES),
                    _i("crop", "COMBO", "center", options=["disabled", "center"])], ["IMAGE"]),
    "VAEEncode": ([_i("pixels", "IMAGE"), _i("vae", "VAE")], ["LATENT"]),
    "VAEDecode": ([_i("samples", "LATENT"), _i("vae", "VAE")], ["IMAGE"]),
    "CLIPTextEncode": ([_i("text", "STRING", PROMPT_KLEIN), _i("clip", "CLIP")], ["CONDITIONING"]),
    "ConditioningZeroOut": ([_i("conditioning", "CONDITIONING")], ["CONDITIONING"]),
    "KSampler": ([_i("model", "MODEL"), _i("seed", "INT", 0, lo=0, hi=MAX_SEED, seed=True),
                  _i("steps", "INT", 4, lo=1, hi=10000), _i("cfg", "FLOAT", 1.0, lo=0.0, hi=100.0),
                  _i("sampler_name", "COMBO", "euler", options=SAMPLERS),
                  _i("scheduler", "COMBO", "simple", options=["simple", "sgm_uniform", "karras", "beta"]),
                  _i("positive", "CONDITIONING"), _i("negative", "CONDITIONING"), _i("latent_image", "LATENT"),
                  _i("denoise", "FLOAT", 1.0, lo=0.0, hi=1.0)], ["LATENT"]),
    "Flux2Scheduler": ([_i("steps", "INT", 4, lo=1, hi=4096), _i("width", "INT", SIZE, lo=16, hi=MAX_RES),
                        _i("height", "INT", SIZE, lo=16, hi=MAX_RES)], ["SIGMAS"]),
    "SplitSigmas": ([_i("sigmas", "SIGMAS"), _i("step", "INT", 1, lo=0, hi=10000)], ["SIGMAS", "SIGMAS"]),
    "RandomNoise": ([_i("noise_seed", "INT", 0, lo=0, hi=MAX_SEED, seed=True)], ["NOISE"]),
    "KSamplerSelect": ([_i("sampler_name", "COMBO", "euler", options=SAMPLERS)], ["SAMPLER"]),
    "BasicGuider": ([_i("model", "MODEL"), _i("conditioning", "CONDITIONING")], ["GUIDER"]),
    "SamplerCustomAdvanced": ([_i("noise", "NOISE"), _i("guider", "GUIDER"), _i("sampler", "SAMPLER"),
                               _i("sigmas", "SIGMAS"), _i("latent_image", "LATENT")], ["LATENT", "LATENT"]),
}  # fmt: skip # keep: a table: one node schema a row


def native_schemas() -> dict:
    return {k: NS(node_id=k, inputs=ins, outputs=[_o(t) for t in outs]) for k, (ins, outs) in NATIVE.items()}


def all_schemas() -> dict:
    return {**sakura_schemas(), **native_schemas()}


SIZES_KLEIN = {
    "UNETLoader": (360, 110), "CLIPLoader": (360, 130), "VAELoader": (360, 80), "ImageScale": (320, 160),
    "VAEEncode": (220, 70), "VAEDecode": (220, 70), "CLIPTextEncode": (420, 200), "ConditioningZeroOut": (260, 50),
    "KSampler": (320, 280), "Flux2Scheduler": (300, 130), "SplitSigmas": (260, 80), "RandomNoise": (300, 90),
    "KSamplerSelect": (300, 60), "BasicGuider": (240, 70), "SamplerCustomAdvanced": (300, 130),
    "SakuraTemplateLoader": (420, 330), "SakuraAdaptiveFetch": (380, 230), "SakuraTemplateKV": (420, 160),
    "SakuraTemplateKVReport": (300, 70), "PreviewAny": (420, 300), "LoadImage": (360, 420), "SaveImage": (420, 460),
    "Note": (420, 560),
}  # fmt: skip # keep: a table of node sizes


def setup_note(what: str, template_id: str, extra: str = "", images: str = "--image <template image>") -> str:
    return (
        f"{what}\n\n"
        "DOWNLOAD (the FLUX.2 [klein] 4B files, as ComfyUI's own klein templates name them) into ComfyUI's models/ "
        "folders:\n"
        f"  models/diffusion_models/{UNET}  (the klein 4B diffusion model)\n"
        f"  models/text_encoders/{TEXT_ENCODER}  (its Qwen3 4B text encoder; CLIPLoader type flux2)\n"
        f"  models/vae/{VAE}  (the FLUX.2 VAE)\n\n"
        f"SAKURA TEMPLATES must be precomputed for those EXACT weights (the Template KV node checks the model id "
        "computed from the loaded weights and refuses another model's template, naming both ids); the edit runs at "
        f"{SIZE}x{SIZE}, klein-files' default size:\n"
        "  sakura precompute --model klein-files:diffusion_model=ComfyUI/models/diffusion_models/"
        f"{UNET},text_encoder=ComfyUI/models/text_encoders/{TEXT_ENCODER},vae=ComfyUI/models/vae/{VAE},"
        f"tokenizer=<Qwen3 tokenizer folder> {images} --id {template_id} "
        f"--store ~/sakura-store{' ' + extra if extra else ''}\n"
        "  sakura serve --store ~/sakura-store --port 8080\n"
        "(docs/comfyui.md, 'ComfyUI's own FLUX.2 [klein]'). Your image and prompt stay on this machine; the "
        "template's K/V streams in while the sampler runs. The Template KV Report shows the levels, split, bytes "
        "and waits."
    ).rstrip()


def _common(template_id: str, user_file: str, prefix: str) -> list[Node]:
    """Loaders, the user image (scaled to the template's size, encoded: the flow's start), prompt, the Sakura chain,
    decode, save and report. The sampler (id 20) and its inputs are added by each workflow."""
    return [
        Node(1, "UNETLoader", "Load klein 4B diffusion model", (40, 60), {"unet_name": UNET}),
        Node(2, "CLIPLoader", "Load Qwen3 text encoder (flux2)", (40, 220), {"clip_name": TEXT_ENCODER,
                                                                              "type": "flux2"}),
        Node(3, "VAELoader", "Load FLUX.2 VAE", (40, 400), {"vae_name": VAE}),
        Node(4, "LoadImage", "Private user image", (40, 530), {"image": user_file, "upload": "image"}),
        Node(5, "ImageScale", f"To the template's size ({SIZE} px)", (440, 530), {"image": (4, 0)}),
        Node(6, "VAEEncode", "Encode (the edit's start)", (440, 740), {"pixels": (5, 0), "vae": (3, 0)}),
        Node(7, "CLIPTextEncode", "Prompt (stays here)", (440, 60), {"clip": (2, 0)}),
        Node(10, "SakuraTemplateLoader", "Sakura Template KV Loader", (920, 60),
             {"template_id": template_id, "source": "server", "server_url": SERVER_URL}),
        Node(11, "SakuraAdaptiveFetch", "Sakura Bandwidth-Adaptive Fetch", (920, 440),
             {"template": (10, 0), "policy": "sakura", "bandwidth": "live"}),
        Node(12, "SakuraTemplateKV", "Sakura Template KV (MODEL patch)", (1380, 60),
             {"model": (1, 0), "template": (10, 0), "kv_stream": (11, 0)}),
        Node(21, "VAEDecode", "Decode", (2260, 60), {"samples": (20, 0), "vae": (3, 0)}),
        Node(22, "SaveImage", "Edited image", (2260, 180), {"images": (21, 0), "filename_prefix": prefix}),
        Node(23, "SakuraTemplateKVReport", "Sakura Template KV Report", (1820, 740),
             {"model": (12, 0), "samples": (20, 0)}),
        Node(24, "PreviewAny", "Report (JSON)", (1820, 860), {"source": (23, 0)}),
    ]  # fmt: skip # keep: a workflow's node table: one node a row


def _ksampler() -> list[Node]:
    """The single-KV edits' sampler: KSampler at cfg 1 (its negative a zeroed prompt, unused), the user photo's
    latent the start (denoise 0.85)."""
    return [
        Node(8, "ConditioningZeroOut", "Negative (unused at cfg 1)", (440, 330), {"conditioning": (7, 0)}),
        Node(20, "KSampler", "KSampler (any sampler works)", (1820, 60),
             {"model": (12, 0), "positive": (7, 0), "negative": (8, 0), "latent_image": (6, 0), "steps": 4,
              "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 0.85}),
    ]  # fmt: skip # keep: a workflow's node table: one node a row


def face_swap() -> list[Node]:
    nodes = _common("klein-face-swap", "sakura-face.png", "sakura/klein-face-swap")
    nodes += [
        *_ksampler(),
        Node(
            30,
            "Note",
            "About this workflow",
            (1380, 290),
            {
                "text": setup_note(
                    "SAKURA face swap on ComfyUI's own FLUX.2 [klein] 4B: the template 'klein-face-swap' (a scene with the "
                    "face region marked) is the reference; its attention K/V was precomputed by the SAKURA server and "
                    "replaces the reference tokens in klein's forward (Sakura Template KV). Your face image is the edit's "
                    "start (denoise 0.85).",
                    "klein-face-swap",
                )
            },
        ),
    ]
    return nodes


def try_on() -> list[Node]:
    """A template of two references (``--image`` twice): the garment and a look wearing it; the user photo the start."""
    nodes = _common("klein-try-on", "sakura-object.png", "sakura/klein-try-on")
    nodes += [
        *_ksampler(),
        Node(
            30,
            "Note",
            "About this workflow",
            (1380, 290),
            {
                "text": setup_note(
                    "SAKURA try-on with two references on ComfyUI's own FLUX.2 [klein] 4B: the template 'klein-try-on' holds "
                    "the attention K/V of two reference images (a garment and a look wearing it; one KV block over both, the "
                    "references attending to each other) and replaces klein's reference tokens (Sakura Template KV). Your "
                    "photo is the edit's start (denoise 0.85); set the prompt to what to wear.",
                    "klein-try-on",
                    images="--image <garment image> --image <look image> --reference-name garment --reference-name look",
                )
            },
        ),
    ]
    nodes[6].values["text"] = "dress the person of the input image in the garment of the reference images"
    return nodes


def per_step_edit() -> list[Node]:
    nodes = _common("klein-edit-per-step", "sakura-object.png", "sakura/klein-edit-per-step")
    nodes += [
        Node(13, "Flux2Scheduler", "The template's schedule (4 steps)", (1380, 290), {"steps": 4}),
        Node(14, "SplitSigmas", "Start at step 1 (the edit's strength)", (1380, 470), {"sigmas": (13, 0), "step": 1}),
        Node(15, "RandomNoise", "Noise", (1380, 600), {"noise_seed": 0}),
        Node(16, "KSamplerSelect", "Sampler", (1820, 380), {"sampler_name": "euler"}),
        Node(17, "BasicGuider", "Guider", (1820, 490), {"model": (12, 0), "conditioning": (7, 0)}),
        Node(20, "SamplerCustomAdvanced", "SamplerCustomAdvanced", (1820, 60),
             {"noise": (15, 0), "guider": (17, 0), "sampler": (16, 0), "sigmas": (14, 1), "latent_image": (6, 0)}),
        Node(30, "Note", "About this workflow", (2720, 60), {"text": setup_note(
            "SAKURA per-step edit on ComfyUI's own FLUX.2 [klein] 4B: the template 'klein-edit-per-step' holds one "
            f"K/V per (step, layer) for Flux2Scheduler's 4-step schedule at {SIZE}x{SIZE}; the patch picks each step's "
            "K/V from the sampler's sigma (another step count or size is refused, naming both schedules). "
            "SplitSigmas starts the edit at step 1 from your image.", "klein-edit-per-step",
            "--kv-mode per-step --steps 4")}),
    ]  # fmt: skip # keep: a workflow's node table: one node a row
    nodes[6].values["text"] = "place the object of the input image in the marked region of the reference image"
    return nodes


KLEIN_WORKFLOWS = {
    "sakura_klein_face_swap": face_swap(),
    "sakura_klein_per_step_edit": per_step_edit(),
    "sakura_klein_try_on": try_on(),
}


def ui_with_sizes(nodes: list[Node], schemas: dict) -> dict:
    nodes = [
        Node(n.id, n.type, n.title, n.pos, n.values, n.size or SIZES_KLEIN[n.type]) for n in completed(nodes, schemas)
    ]
    return ui_format(nodes, schemas)


def render_klein(schemas: dict) -> dict[Path, str]:
    return {
        OUT / f"{name}.json": json.dumps(ui_with_sizes(nodes, schemas), indent=2) + "\n"
        for name, nodes in KLEIN_WORKFLOWS.items()
    }


def klein_thumbnail(title: str) -> bytes:
    """``<name>.jpg``: no klein runs here, so the chain drawn as boxes (256 x 256)."""
    import io

    from PIL import Image, ImageDraw

    canvas = Image.new("RGB", (256, 256), (24, 24, 28))
    draw = ImageDraw.Draw(canvas)
    draw.text((12, 12), "FLUX.2 [klein] 4B", fill=(235, 140, 170))
    draw.text((12, 28), title, fill=(230, 230, 230))
    for row, label in enumerate(["UNETLoader", "Sakura Template KV", "sampler", "VAEDecode -> image"]):
        y = 64 + row * 46
        draw.rectangle([40, y, 216, y + 30], outline=(235, 140, 170), width=2)
        draw.text((52, y + 9), label, fill=(230, 230, 230))
    out = io.BytesIO()
    canvas.save(out, "JPEG", quality=88)
    return out.getvalue()


THUMB_TITLES = {
    "sakura_klein_face_swap": "SAKURA face swap",
    "sakura_klein_per_step_edit": "SAKURA per-step edit",
    "sakura_klein_try_on": "SAKURA try-on (two references)",
}

if __name__ == "__main__":
    for path, text in render_klein(all_schemas()).items():
        path.write_text(text)
        path.with_suffix(".jpg").write_bytes(klein_thumbnail(THUMB_TITLES[path.stem]))
