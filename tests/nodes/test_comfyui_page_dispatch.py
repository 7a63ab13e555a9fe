"""Dispatch from a real ComfyUI (``COMFYUI_DIR`` / ``COMFYUI_PYTHON``, started as ``test_real_comfyui.py`` does) to a
phone page in headless Chromium: the page opens ComfyUI's ``/sakura/phone``, pairs with a code ComfyUI gave out, and
takes the phone workflow's job (API format, the Sakura Phone Device's connection ``page``); it fetches the template
KV and the web model from a loopback cloud server that allows ComfyUI's origin (CORS, ``--allow-origin``), runs the
edit and posts it back. The workflow's image equals the Python edit of the same job (>= 45 dB), the report is the
one format naming the browser, and the cloud saw no image or prompt bytes. A page closed mid-job is a node error
within the bound (``stale_after_s``); an interrupt stops a job the page is stuck in."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from ci_deps import import_or_skip, require_or_skip

from ..phone_web.loopback import loopback_server
from ..phone_web.page_driver import recording_app
from .conftest import start_comfyui, stop_process
from .test_real_comfyui import _post, _run_wait

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "")
require_or_skip(
    bool(COMFYUI_DIR),
    "COMFYUI_DIR is not set: this test needs a ComfyUI checkout (DEVELOPERS.md)",
    allow_module_level=True,
)
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
require_or_skip(
    shutil.which(CHROMIUM) or Path(CHROMIUM).is_file(),
    f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)",
    allow_module_level=True,
)
sync_api = import_or_skip("playwright.sync_api", "the page test needs playwright (pip install 'sakura-kv[test]')")
REPO = Path(__file__).resolve().parents[2]
require_or_skip(
    (REPO / "phone_web" / "node_modules" / "onnxruntime-web" / "dist" / "ort.wasm.min.mjs").is_file(),
    "phone_web's npm packages are not installed (run `npm ci` in phone_web/)",
    allow_module_level=True,
)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TEMPLATE_ID = "face-swap-astronaut"  # published with store_profile "full" (the exact fp16 rung) by store_dir
PROMPT = "paint it in sakura pink 9"
STEPS, SEED = 3, 5
USER_PNG = "page-user.png"
STALE_AFTER_S = 10.0  # PageHubConfig's default: a page silent this long has gone


@pytest.fixture(scope="module")
def setup(tmp_path_factory, examples, demo_model, store_dir, comfyui_python):
    """(ComfyUI URL, its base folder, the cloud's base URL, the cloud's request log, the user image)."""
    from PIL import Image

    from cloud_server.store import LocalStore
    from sakura_core.cli import main
    from sakura_core.models.edit_model import load_image

    root = tmp_path_factory.mktemp("page-dispatch")
    assert main(["export", "--target", "web", "--out", str(root / "model")]) == 0
    proc, url, log = start_comfyui(COMFYUI_DIR, root / "comfy", examples, python=comfyui_python)
    try:
        user = load_image(examples.user_image("sakura-face.png"), demo_model.spec.image_size)  # the model's size
        Image.fromarray(user).save(root / "comfy" / "input" / USER_PNG)
        seen: list[dict] = []
        app = recording_app(LocalStore(store_dir), root / "model", seen, allowed_origins=(url,))
        with loopback_server(app) as cloud:
            yield {"url": url, "base": root / "comfy", "cloud": cloud, "seen": seen, "user": user, "log": log}
    finally:
        stop_process(proc)


def _workflow(cloud: str, connection: str = "page") -> dict:
    wf = json.loads((REPO / "example_workflows" / "api" / "sakura_in_context_edit_on_phone.json").read_text())
    for node in wf.values():
        inputs, kind = node["inputs"], node["class_type"]
        if kind == "SakuraTemplateLoader":
            inputs.update(server_url=cloud, template_id=TEMPLATE_ID)
        elif kind == "SakuraPhoneDevice":
            inputs.update(connection=connection, token="", cloud_url="")
        elif kind == "SakuraPipelinedSampler":
            inputs.update(steps=STEPS, seed=SEED, prompt=PROMPT)
        elif kind == "LoadImage":
            inputs["image"] = USER_PNG
    return wf


def _paired_page(browser, url: str):
    """A page on ComfyUI's /sakura/phone, paired with a fresh code typed into its form."""
    import urllib.request

    ask = urllib.request.Request(
        f"{url}/sakura/phone/api/code", data=b"", method="POST", headers={"X-Sakura-Request": "1"}
    )  # what web/sakura.js sends
    with urllib.request.urlopen(ask, timeout=10) as answer:
        code = json.loads(answer.read())["code"]
    page = browser.new_page(viewport={"width": 412, "height": 915})
    page.goto(f"{url}/sakura/phone")
    page.wait_for_function("document.getElementById('status').dataset.state === 'pairing'", timeout=30_000)
    page.fill("#code", code.lower())
    page.click("#pairing")
    page.wait_for_function(
        "['paired', 'error'].includes(document.getElementById('status').dataset.state)", timeout=30_000
    )
    assert page.evaluate("document.getElementById('status').dataset.state") == "paired", page.evaluate(
        "document.getElementById('status').textContent"
    )
    return page, code


def _python_edit(store_dir, model, user: np.ndarray, seed: int) -> np.ndarray:
    """The same job in Python: the template's KV decoded at fp16, injected in every layer (what the page runs)."""
    from cloud_server.store import LocalStore
    from sakura_core.kv.template_codec import decode_template
    from sakura_core.runtime.denoise import run_edit

    store = LocalStore(store_dir)
    manifest = store.get_manifest(TEMPLATE_ID)
    blobs = {}
    for shard in manifest["shards"]:
        for rep in (r for r in shard["representations"] if r["name"] == "fp16"):
            f, _ = store.open_shard(rep["digest"])
            with f:
                blobs[rep["digest"]] = f.read()
    kv = decode_template(manifest, blobs, "fp16")
    return run_edit(
        model,
        user,
        PROMPT,
        steps=STEPS,
        seed=seed,
        split_layer=0,
        kv_source=kv,
        kv_mode=manifest.get("kv_mode", "single"),
    ).image


def test_comfyui_runs_the_phone_workflow_on_a_paired_page(setup, store_dir, demo_model):
    from PIL import Image

    from sakura_core.edit_report import REPORT_KEYS
    from sakura_core.metrics import psnr_uint8

    url, cloud, seen = setup["url"], setup["cloud"], setup["seen"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page, code = _paired_page(browser, url)
            seen.clear()
            queued = _post(f"{url}/prompt", {"prompt": _workflow(cloud), "client_id": uuid.uuid4().hex})
            entry = _run_wait(url, queued["prompt_id"], 300)
            page_state = page.evaluate("document.getElementById('status').dataset.state")
        finally:
            browser.close()
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"]["messages"])[:3000]
    assert page_state == "done"
    saved = entry["outputs"]["6"]["images"][0]
    got = np.asarray(Image.open(setup["base"] / "output" / saved["subfolder"] / saved["filename"]).convert("RGB"))
    want = _python_edit(store_dir, demo_model, setup["user"], SEED)
    psnr = psnr_uint8(got, want)
    print(f"ComfyUI -> page vs python: PSNR {psnr:.2f} dB, max |diff| {int(np.abs(got.astype(int) - want).max())}")  # noqa: T201
    assert psnr >= 45.0, psnr
    assert psnr_uint8(got, _python_edit(store_dir, demo_model, setup["user"], SEED + 1)) < 40.0  # it can fail
    report = json.loads(entry["outputs"]["8"]["text"][0])
    assert tuple(report) == REPORT_KEYS and report["template_id"] == TEMPLATE_ID
    on = report["executed_on"]
    assert on["kind"] == "browser" and "Chrome" in on["browser"] and on["execution_provider"] == "wasm"
    assert on["connection"] == f"page:{code}" and on["cloud_url"] == cloud and on["policy_requested"] == "sakura"
    assert report["steps"] == STEPS and report["seed"] == SEED and report["bytes_fetched"] > 100_000
    # the page fetched the KV and the model from the cloud itself, and nothing of the user reached it
    paths = {r["path"].split("?")[0] for r in seen}
    assert f"/v1/templates/{TEMPLATE_ID}/manifest" in paths and "/phone/model/dit_cached_kv.onnx" in paths
    assert any(r["headers"].get("Origin") == url for r in seen)  # across origins, from ComfyUI's page
    assert all(r["method"] in ("GET", "HEAD", "OPTIONS") and r["body"] == b"" for r in seen)
    blob = json.dumps([[r["path"], r["headers"]] for r in seen])
    assert PROMPT not in blob and PROMPT.replace(" ", "%20") not in blob and "sakura+pink" not in blob


def _stalled_job(setup, browser):
    """A paired page whose shard fetches never answer, and a queued phone workflow it has taken: (page, prompt id)."""
    url, cloud = setup["url"], setup["cloud"]
    page, code = _paired_page(browser, url)
    held: list = []
    page.route("**/v1/shards/**", lambda route: held.append(route))  # held: no finish until they are let go
    queued = _post(f"{url}/prompt", {"prompt": _workflow(cloud, f"page:{code}"), "client_id": uuid.uuid4().hex})
    deadline = time.monotonic() + 120
    while page.evaluate("document.getElementById('status').dataset.state") != "running":
        assert time.monotonic() < deadline, "the page never took the job"
        time.sleep(0.2)
    return page, code, queued["prompt_id"], held


def test_a_page_closed_mid_job_is_a_node_error_within_the_bound(setup):
    url = setup["url"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page, code, prompt_id, _ = _stalled_job(setup, browser)
            t0 = time.monotonic()
            page.close()
            entry = _run_wait(url, prompt_id, STALE_AFTER_S + 20)
            took_s = time.monotonic() - t0
        finally:
            browser.close()
    assert entry["status"]["status_str"] == "error"
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    message = errors[0]["exception_message"]
    assert f"phone page {code}" in message and ("closed" in message or "stopped answering" in message), message
    assert errors[0]["node_type"] == "SakuraPipelinedSampler"
    assert took_s < STALE_AFTER_S + 5, took_s


def test_an_interrupt_stops_a_job_on_the_page(setup):
    url = setup["url"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page, code, prompt_id, held = _stalled_job(setup, browser)
            t0 = time.monotonic()
            _post(f"{url}/interrupt", None)
            entry = _run_wait(url, prompt_id, 30)
            stopped_s = time.monotonic() - t0
            pages = _pages(url)
            page.unroute("**/v1/shards/**")
            for route in held:  # the page runs on, and hears the cancel at its next progress
                route.continue_()
            page.wait_for_function("document.getElementById('status').dataset.state === 'error'", timeout=30_000)
            said = page.evaluate("document.getElementById('status').textContent")
        finally:
            browser.close()
    assert "execution_interrupted" in [m[0] for m in entry["status"]["messages"]]
    assert stopped_s < 5.0, stopped_s
    assert [p["busy"] for p in pages if p["code"] == code] == [False]  # ComfyUI freed the page at once
    assert "cancelled by ComfyUI" in said, said


def _pages(url: str) -> list[dict]:
    import urllib.request

    ask = urllib.request.Request(f"{url}/sakura/phone/api/pages", headers={"X-Sakura-Request": "1"})
    with urllib.request.urlopen(ask, timeout=10) as answer:
        return json.loads(answer.read())["pages"]
