"""What the page tests share: the demo templates published for the page (:func:`publish_page_store`), the same edit
in Python (:func:`python_edit`), a server whose requests are recorded (:func:`recording_app`), and the steps a user
takes in the page at ``/phone`` in headless Chromium (open, fill the form, press Edit, read what it shows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sakura_tools.bench.page_driver import CHROMIUM, FLAGS

__all__ = [
    "CHROMIUM",
    "FLAGS",
    "PER_STEP_ID",
    "PHOTO_NAME",
    "PROMPT",
    "SEED",
    "STEPS",
    "TEMPLATE_ID",
    "TWO_REF_ID",
    "WEB",
    "fill_edit",
    "finish_edit",
    "open_page",
    "page_state",
    "publish_page_store",
    "python_edit",
    "recording_app",
    "store_blobs",
]

WEB = Path(__file__).resolve().parents[2] / "phone_web"
TEMPLATE_ID = "web-astronaut"
PER_STEP_ID = "web-astronaut-per-step"
TWO_REF_ID = "web-try-on-pair"
PROMPT = "paint it in sakura pink 7"  # nothing else the page sends could contain this
STEPS, SEED = 3, 11
PHOTO_NAME = "photo.png"


def publish_page_store(root: Path):
    """(store, model dir, demo model, model index): a single template (the SAKURA ladder), a per-step one and a
    two-reference one (fp16 only: fast precomputes), the web model exported by ``sakura export --target web``."""
    import torch

    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.cli import main
    from sakura_core.models.edit_model import load_demo_model, load_image

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["export", "--target", "web", "--out", str(root / "model")]) == 0
        model = load_demo_model()
        store = LocalStore(root / "store")
        image = load_image("astronaut", model.spec.image_size)
        # full: the page fetches the exact fp16 rung, which a serving store does not keep
        publish_template(store, model, image, TEMPLATE_ID, store_profile="full")
        publish_template(
            store, model, image, PER_STEP_ID, kv_mode="per-step", steps=STEPS, codec="fp16", store_profile="full"
        )
        pair = [image, load_image("coffee", model.spec.image_size)]
        publish_template(
            store, model, pair, TWO_REF_ID, codec="fp16", store_profile="full", reference_names=["person", "garment"]
        )
    finally:
        torch.set_num_threads(threads)
    return store, root / "model", model, json.loads((root / "model" / "model.json").read_text())


def store_blobs(store, manifest: dict) -> dict[str, bytes]:
    """Every representation blob ``manifest``'s shards name, read from ``store``: digest -> bytes."""
    blobs = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            if rep["digest"] is not None:
                f, _ = store.open_shard(rep["digest"])
                with f:
                    blobs[rep["digest"]] = f.read()
    return blobs


def python_edit(store, model, user: np.ndarray, seed: int, template_id: str, split: int, level: str = "fp16"):
    """The same job in Python: the template's KV decoded at ``level``, injected for layers >= split, the template
    image's own for layers < split (run_edit's hybrid step 0)."""
    from PIL import Image

    from sakura_core.kv.template_codec import decode_template
    from sakura_core.runtime.denoise import run_edit

    manifest = store.get_manifest(template_id)
    blobs = store_blobs(store, manifest)
    kv = decode_template(manifest, blobs, level)
    mode = manifest.get("kv_mode", "single")
    template = None  # split 0: every layer's KV fetched (the grid, one reference or several, from the KV)
    if split:
        f, _ = store.open_shard(manifest["template_image"]["digest"])
        with f:
            template = np.asarray(Image.open(f).convert("RGB"))
    return run_edit(
        model,
        user,
        PROMPT,
        steps=STEPS,
        seed=seed,
        split_layer=split,
        kv_source=kv,
        kv_mode=mode,
        template_image=template,
    ).image


def recording_app(store, model_dir, seen: list[dict], **config):
    """``create_app`` as ``sakura serve --phone-model`` runs it; each request (method, path, headers, body) is
    appended to ``seen``."""
    from aiohttp import web

    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    app = create_app(ServerConfig(store_dir=store.root, model=None, phone_model_dir=model_dir, **config), store=store)

    @web.middleware
    async def record(request, handler):
        body = await request.read() if request.can_read_body else b""
        seen.append(
            {"method": request.method, "path": request.path_qs, "headers": dict(request.headers), "body": body}
        )
        return await handler(request)

    app.middlewares.insert(0, record)
    return app


def open_page(browser, url: str):
    """A phone-sized page at ``url``, waited until the model is ready (or the page shows an error)."""
    page = browser.new_page(viewport={"width": 412, "height": 915})  # a phone's viewport
    page.goto(url)
    page.wait_for_function(
        "document.getElementById('status').dataset.ep || document.getElementById('status').dataset.state === 'error'",
        timeout=60_000,
    )
    return page


def fill_edit(
    page, photo: Path, template_id: str, *, split: int = 0, level: str = "fp16", steps: int = STEPS, seed: int = SEED
) -> None:
    """Pick the photo, template, level and split; type the prompt, steps and seed (Edit not pressed)."""
    if page.evaluate("document.getElementById('input').dataset.loaded") != "true":
        page.set_input_files("#photo", str(photo))
        page.wait_for_function("document.getElementById('input').dataset.loaded === 'true'", timeout=60_000)
    page.fill("#prompt", PROMPT)
    page.fill("#steps", str(steps))
    page.fill("#seed", str(seed))
    page.select_option("#template", template_id)
    page.wait_for_function(
        f"document.getElementById('level').dataset.template === {json.dumps(template_id)}", timeout=30_000
    )
    page.select_option("#level", level)
    page.select_option("#split", str(split))


def finish_edit(page, timeout_ms: int = 180_000) -> None:
    """Wait for the edit under way to end (done or error)."""
    page.wait_for_function(
        "['done', 'error'].includes(document.getElementById('status').dataset.state)", timeout=timeout_ms
    )


def page_state(page) -> dict:
    """What the page shows: status text and state, the report, the page's scroll width, the result's pixels
    ((size, size, 3) uint8)."""
    state = page.evaluate("""() => ({status: document.getElementById('status').textContent,
        state: document.getElementById('status').dataset.state,
        report: document.getElementById('report').textContent,
        scroll: document.documentElement.scrollWidth,
        size: document.getElementById('result').width,
        pixels: Array.from(document.getElementById('result').getContext('2d')
            .getImageData(0, 0, document.getElementById('result').width, document.getElementById('result').height).data)})""")
    size = state.pop("size")
    state["image"] = np.array(state.pop("pixels"), np.uint8).reshape(size, size, 4)[..., :3]
    return state
