"""An edit that really runs in the page: headless Chromium opens ``/phone`` of a loopback server (``create_app``, as
``sakura serve --phone-model DIR`` runs it) over a store holding a demo template precomputed with the real codec;
the page loads the model files of ``sakura export --target web`` (:func:`android_bridge.web_export.export_web`),
takes a photo from its file input and a prompt, fetches the template's manifest and fp16 shards, runs the sampler
with onnxruntime-web (fp32 WASM) and shows the result, for a single and a per-step template. The result equals the
Python edit of the same job (same template KV decoded at fp16, every layer injected, same image, prompt, seed and
steps) to >= 45 dB (here: pixel for pixel), and no request the server saw carries the photo or the prompt."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from ci_deps import import_or_skip, require_or_skip

from .loopback import loopback_server

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
require_or_skip(shutil.which(CHROMIUM) or Path(CHROMIUM).is_file(),
                f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)",
                allow_module_level=True)  # fmt: skip
sync_api = import_or_skip("playwright.sync_api", "the page test needs playwright (pip install 'sakura-kv[test]')")

WEB = Path(__file__).resolve().parents[2] / "phone_web"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip
TEMPLATE_ID = "web-astronaut"
PER_STEP_ID = "web-astronaut-per-step"
PROMPT = "paint it in sakura pink 7"  # nothing else the page sends could contain this
STEPS, SEED = 3, 11
LINK_MBIT, LINK_MS = 8, 40  # the link CDP shapes during the edit


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(store, model dir, demo model, model index): a single template (the SAKURA ladder) and a per-step one (fp16
    only: a fast precompute) published, the web model exported by the one command (``sakura export --target web``)."""
    import torch

    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.cli import main
    from sakura_core.models.edit_model import load_demo_model, load_image

    require_or_skip((WEB / "node_modules" / "onnxruntime-web" / "dist" / "ort.wasm.min.mjs").is_file(),
                    "phone_web's npm packages are not installed (run `npm ci` in phone_web/)")  # fmt: skip
    root = tmp_path_factory.mktemp("web-edit")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["export", "--target", "web", "--out", str(root / "model")]) == 0
        model = load_demo_model()
        store = LocalStore(root / "store")
        image = load_image("astronaut", model.spec.image_size)
        # full: the page fetches the exact fp16 rung, which a serving store does not keep
        publish_template(store, model, image, TEMPLATE_ID, store_profile="full")
        publish_template(store, model, image, PER_STEP_ID, kv_mode="per-step", steps=STEPS, codec="fp16",
                         store_profile="full")  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return store, root / "model", model, json.loads((root / "model" / "model.json").read_text())


def _python_edit(store, model, user: np.ndarray, seed: int, template_id: str, split: int) -> np.ndarray:
    """The same job in Python: the template's KV decoded at fp16, injected for layers >= split, the template image's
    own for layers < split (run_edit's hybrid step 0)."""
    from PIL import Image

    from sakura_core.kv.template_codec import decode_template
    from sakura_core.runtime.denoise import run_edit

    manifest = store.get_manifest(template_id)
    blobs = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            if rep["name"] == "fp16":
                f, _ = store.open_shard(rep["digest"])
                with f:
                    blobs[rep["digest"]] = f.read()
    kv = decode_template(manifest, blobs, "fp16")
    mode = manifest.get("kv_mode", "single")
    f, _ = store.open_shard(manifest["template_image"]["digest"])
    with f:
        template = np.asarray(Image.open(f).convert("RGB"))
    return run_edit(model, user, PROMPT, steps=STEPS, seed=seed, split_layer=split, kv_source=kv, kv_mode=mode,
                    template_image=template).image  # fmt: skip


@pytest.mark.parametrize(("template_id", "split"), [(TEMPLATE_ID, 0), (PER_STEP_ID, 0), (TEMPLATE_ID, 3)])
def test_an_edit_runs_in_the_page_and_equals_python(served, tmp_path, template_id, split):
    from PIL import Image

    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from sakura_core.metrics import psnr_uint8
    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = served
    user = load_image("chelsea", model.spec.image_size)
    photo = tmp_path / "photo.png"
    Image.fromarray(user).save(photo)
    app = create_app(ServerConfig(store_dir=store.root, model=None, phone_model_dir=model_dir), store=store)
    seen: list[dict] = []

    from aiohttp import web

    @web.middleware
    async def record(request, handler):
        body = await request.read() if request.can_read_body else b""
        seen.append(
            {"method": request.method, "path": request.path_qs, "headers": dict(request.headers), "body": body}
        )
        return await handler(request)

    app.middlewares.insert(0, record)
    with loopback_server(app) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 412, "height": 915})  # a phone's viewport
            page.goto(f"{base}/phone")
            page.wait_for_function("document.getElementById('status').dataset.ep || "
                                   "document.getElementById('status').dataset.state === 'error'", timeout=60_000)  # fmt: skip
            page.set_input_files("#photo", str(photo))
            page.wait_for_function("document.getElementById('input').dataset.loaded === 'true'", timeout=10_000)
            page.fill("#prompt", PROMPT)
            page.fill("#steps", str(STEPS))
            page.fill("#seed", str(SEED))
            page.select_option("#template", template_id)
            page.select_option("#split", str(split))
            # the edit's own traffic over a shaped link and a 4x slower CPU (the model files came unshaped)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Network.enable")
            cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": LINK_MS,
                     "downloadThroughput": LINK_MBIT * 1e6 / 8, "uploadThroughput": LINK_MBIT * 1e6 / 8})  # fmt: skip
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
            page.click("#go")
            page.wait_for_function("['done', 'error'].includes(document.getElementById('status').dataset.state)",
                                   timeout=120_000)  # fmt: skip
            state = page.evaluate("""() => ({status: document.getElementById('status').textContent,
                state: document.getElementById('status').dataset.state,
                report: document.getElementById('report').textContent,
                scroll: document.documentElement.scrollWidth,
                pixels: Array.from(document.getElementById('result').getContext('2d')
                    .getImageData(0, 0, 64, 64).data)})""")  # fmt: skip
            if template_id == PER_STEP_ID:  # a per-step template at other steps, or with a split: a clear error
                state["errors"] = [_edit_error(page, steps, split) for steps, split in ((STEPS + 1, 0), (STEPS, 3))]
        finally:
            browser.close()
    assert state["state"] == "done", state["status"]
    if template_id == PER_STEP_ID:
        assert (
            f"computed for {STEPS} steps" in state["errors"][0]
            and "run it with the template's steps" in state["errors"][0]
        )
        assert "single-KV templates only (choose split 0)" in state["errors"][1]
    report = json.loads(state["report"])
    got = np.array(state["pixels"], np.uint8).reshape(64, 64, 4)[..., :3]
    want = _python_edit(store, model, user, SEED, template_id, split)
    psnr = psnr_uint8(got, want)
    diff = int(np.abs(got.astype(int) - want).max())
    figures = f"{template_id} split {split}: PSNR {psnr:.2f} dB, max |diff| {diff}; {report['bytes_fetched']} B fetched; EP {report['executed_on']['execution_provider']}; {report['timings_s']}"
    print(f"page vs python: {figures}")  # noqa: T201 - the figures of the run (pytest -s)
    assert psnr >= 45.0, psnr
    # the comparison can fail: the same job with the next seed is a different image (about 32 dB from this one)
    assert psnr_uint8(got, _python_edit(store, model, user, SEED + 1, template_id, split)) < 40.0
    on = report["executed_on"]
    assert on["kind"] == "browser" and "Chrome" in on["browser"] and on["execution_provider"] == "wasm"
    assert [t["ep"] for t in on["providers_tried"]] == ["webnn", "webgpu", "wasm"]
    assert report["level"] == "fp16" and report["steps"] == STEPS and report["bytes_fetched"] > 100_000
    # the shaped link held: the shards cannot have come faster than LINK_MBIT
    assert report["timings_s"]["fetch_decode"] >= report["bytes_fetched"] * 8 / (LINK_MBIT * 1e6)
    assert state["scroll"] <= 412  # no horizontal scrolling at a phone's width
    # nothing of the user reached the server: every request a GET without a body, no prompt anywhere
    png = photo.read_bytes()
    assert seen and all(r["method"] in ("GET", "HEAD") and r["body"] == b"" for r in seen)
    blob = json.dumps([[r["path"], r["headers"]] for r in seen])
    assert PROMPT not in blob and PROMPT.replace(" ", "%20") not in blob and "sakura+pink" not in blob
    assert not any(png[:64] in r["body"] for r in seen)
    paths = {r["path"].split("?")[0] for r in seen}
    assert report["kv_mode"] == store.get_manifest(template_id).get("kv_mode", "single")
    assert f"/v1/templates/{template_id}/manifest" in paths and "/phone/model/dit_cached_kv.onnx" in paths
    # what was fetched: the fp16 shards of layers >= split, and the template image when the page ran layers < split
    manifest = store.get_manifest(template_id)
    want = {r["digest"] for shard in manifest["shards"] if shard["layers"][0] >= split
            for r in shard["representations"] if r["name"] == "fp16"}  # fmt: skip
    want |= {manifest["template_image"]["digest"]} if split else set()
    assert {p.removeprefix("/v1/shards/") for p in paths if p.startswith("/v1/shards/")} == want
    assert report["split_layer"] == split


def _edit_error(page, steps: int, split: int) -> str:
    """Press Edit with ``steps`` and ``split``; the status line, which must be the page's error state."""
    page.fill("#steps", str(steps))
    page.select_option("#split", str(split))
    page.evaluate("document.getElementById('status').dataset.state = ''")
    page.click("#go")
    page.wait_for_function("['done', 'error'].includes(document.getElementById('status').dataset.state)")
    assert page.evaluate("document.getElementById('status').dataset.state") == "error"
    return page.evaluate("document.getElementById('status').textContent")


async def test_the_model_files_are_served_only_with_phone_model(served, aiohttp_client):
    """``/phone/model/`` serves the export's files from ``--phone-model`` (and ``/phone/vendor/ort/`` the runtime);
    without ``--phone-model`` a 404 says how; nothing else is served."""
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    store, model_dir, _, index = served
    client = await aiohttp_client(
        create_app(ServerConfig(store_dir=store.root, model=None, phone_model_dir=model_dir), store=store)
    )
    answer = await client.get("/phone/model/model.json")
    assert answer.status == 200 and answer.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert (await answer.json())["model_id"] == index["model_id"]
    graph = await client.get("/phone/model/dit_cached_kv.onnx")
    assert await graph.read() == (model_dir / "dit_cached_kv.onnx").read_bytes()
    for bad in ("/phone/model/%2e%2e/%2e%2e/pyproject.toml", "/phone/model/missing.onnx", "/phone/vendor/ort/ort.mjs",
                "/phone/vendor/ort/../../package.json"):  # fmt: skip
        assert (await client.get(bad)).status in (400, 404), bad
    wasm = await client.get("/phone/vendor/ort/ort-wasm-simd-threaded.wasm")
    assert wasm.status == 200 and wasm.headers["Content-Type"] == "application/wasm"
    bare = await aiohttp_client(create_app(ServerConfig(store_dir=store.root, model=None), store=store))
    answer = await bare.get("/phone/model/model.json")
    assert answer.status == 404 and "--phone-model" in (await answer.json())["error"]
