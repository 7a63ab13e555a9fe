"""An edit that really runs in the page: headless Chromium opens ``/phone`` of a loopback server (``create_app``, as
``sakura serve --phone-model DIR`` runs it) over a store holding demo templates precomputed with the real codec;
the page loads the model files of ``sakura export --target web`` (:func:`android_bridge.web_export.export_web`),
takes a photo from its file input and a prompt, fetches the template's manifest and fp16 shards over a link shaped by
CDP from a synthetic bandwidth trace (``sakura traces synth``) with the CPU throttled 4x, runs the sampler with
onnxruntime-web (fp32 WASM) and shows the result, for a single, a per-step and a two-reference template. The result
equals the Python edit of the same job (same template KV decoded at fp16, every layer injected, same image, prompt,
seed and steps) to >= 45 dB (here: pixel for pixel), and no request the server saw carries the photo or the prompt."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sakura_tools.bench.page_link import TraceLink

from .loopback import loopback_server
from .page_driver import (
    PER_STEP_ID,
    PROMPT,
    SEED,
    STEPS,
    TEMPLATE_ID,
    TWO_REF_ID,
    fill_edit,
    open_page,
    page_state,
    python_edit,
    recording_app,
)

LINK_MS = 40  # the one-way latency CDP adds to every request during the edit
TRACE_TIME_SCALE = 0.25  # the trace's 1 s segments last 0.25 s: even the split's 0.3 MB fetch meets several rates


def _done(page) -> bool:
    return page.evaluate("['done', 'error'].includes(document.getElementById('status').dataset.state)")


@pytest.mark.parametrize(
    ("template_id", "split"), [(TEMPLATE_ID, 0), (PER_STEP_ID, 0), (TEMPLATE_ID, 3), (TWO_REF_ID, 0)]
)
def test_an_edit_runs_in_the_page_and_equals_python(page_store, link_trace, chromium, tmp_path, template_id, split):
    from PIL import Image

    from sakura_core.metrics import psnr_uint8
    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = page_store
    user = load_image("chelsea", model.spec.image_size)
    photo = tmp_path / "photo.png"
    Image.fromarray(user).save(photo)
    seen: list[dict] = []
    with loopback_server(recording_app(store, model_dir, seen)) as base:
        page = open_page(chromium, f"{base}/phone")
        fill_edit(page, photo, template_id, split=split)
        # the edit's own traffic over the trace's link and a 4x slower CPU (the model files came unshaped)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
        link = TraceLink(page, cdp, link_trace, latency_ms=LINK_MS, time_scale=TRACE_TIME_SCALE)
        link.run(lambda: page.click("#go"), lambda: _done(page))
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
        state = page_state(page)
        if template_id == PER_STEP_ID:  # a per-step template at other steps: a clear error
            state["errors"] = [_edit_error(page, STEPS + 1, 0)]
        if template_id == TWO_REF_ID:  # the two references' template layers are not computed in the page
            state["errors"] = [_edit_error(page, STEPS, 3)]
    assert state["state"] == "done", state["status"]
    if template_id == PER_STEP_ID:
        assert (
            f"computed for {STEPS} steps" in state["errors"][0]
            and "run it with the template's steps" in state["errors"][0]
        )
    if template_id == TWO_REF_ID:
        assert "has 2 references" in state["errors"][0] and "(choose split 0)" in state["errors"][0]
    report = json.loads(state["report"])
    got = state["image"]
    want = python_edit(store, model, user, SEED, template_id, split)
    psnr = psnr_uint8(got, want)
    diff = int(np.abs(got.astype(int) - want).max())
    figures = f"{template_id} split {split}: PSNR {psnr:.2f} dB, max |diff| {diff}; {report['bytes_fetched']} B fetched; EP {report['executed_on']['execution_provider']}; {report['timings_s']}; link updates {len(link.applied)}"
    print(f"page vs python: {figures}")  # noqa: T201 - the figures of the run (pytest -s)
    assert psnr >= 45.0, psnr
    # the comparison can fail: the same job with the next seed is a different image (about 32 dB from this one)
    assert psnr_uint8(got, python_edit(store, model, user, SEED + 1, template_id, split)) < 40.0
    on = report["executed_on"]
    assert on["kind"] == "browser" and "Chrome" in on["browser"] and on["execution_provider"] == "wasm"
    assert [t["ep"] for t in on["providers_tried"]] == ["webnn", "webgpu", "wasm"]
    assert report["level"] == "fp16" and report["steps"] == STEPS and report["bytes_fetched"] > 100_000
    assert report["references"] == len(store.get_manifest(template_id).get("references", [None]))
    # the trace's link held: the shards came no faster than 4x its fastest segment (Chromium's throttle lets a burst
    # through around each CDP update, and a loaded host delays the updates: measured up to 1.5x at 0.25 s segments on
    # a quiet host, 2.2x with 5 jobs beside it; the unshaped loopback is > 100x faster), and it changed rate
    assert report["timings_s"]["fetch_decode"] >= report["bytes_fetched"] / (4 * link.fastest_bytes_per_s())
    assert len({rate for _, rate in link.applied}) >= 2, link.applied
    assert state["scroll"] <= 412  # no horizontal scrolling at a phone's width
    _nothing_of_the_user(seen, photo.read_bytes())
    paths = {r["path"].split("?")[0] for r in seen}
    assert report["kv_mode"] == store.get_manifest(template_id).get("kv_mode", "single")
    assert f"/v1/templates/{template_id}/manifest" in paths and "/phone/model/dit_cached_kv.onnx" in paths
    # what was fetched: the fp16 shards of layers >= split, and the template image when the page ran layers < split
    manifest = store.get_manifest(template_id)
    want = {
        r["digest"]
        for shard in manifest["shards"]
        if shard["layers"][0] >= split
        for r in shard["representations"]
        if r["name"] == "fp16"
    }
    want |= {manifest["template_image"]["digest"]} if split else set()
    assert {p.removeprefix("/v1/shards/") for p in paths if p.startswith("/v1/shards/")} == want
    # a single template's split 3 ran the split graph (template_kv.onnx), not the template pass
    assert report["split_layer"] == split and report["template_pass"] is False


def _nothing_of_the_user(seen: list[dict], png: bytes) -> None:
    """Every request a GET without a body, no prompt in any path or header, no photo bytes anywhere."""
    assert seen and all(r["method"] in ("GET", "HEAD") and r["body"] == b"" for r in seen)
    blob = json.dumps([[r["path"], r["headers"]] for r in seen])
    assert PROMPT not in blob and PROMPT.replace(" ", "%20") not in blob and "sakura+pink" not in blob
    assert not any(png[:64] in r["body"] for r in seen)


def _edit_error(page, steps: int, split: int) -> str:
    """Press Edit with ``steps`` and ``split``; the status line, which must be the page's error state."""
    page.fill("#steps", str(steps))
    page.select_option("#split", str(split))
    page.evaluate("document.getElementById('status').dataset.state = ''")
    page.click("#go")
    page.wait_for_function("['done', 'error'].includes(document.getElementById('status').dataset.state)")
    assert page.evaluate("document.getElementById('status').dataset.state") == "error"
    return page.evaluate("document.getElementById('status').textContent")


async def test_the_model_files_are_served_only_with_phone_model(page_store, aiohttp_client):
    """``/phone/model/`` serves the export's files from ``--phone-model`` (and ``/phone/vendor/ort/`` the runtime);
    without ``--phone-model`` a 404 says how; nothing else is served."""
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    store, model_dir, _, index = page_store
    client = await aiohttp_client(
        create_app(ServerConfig(store_dir=store.root, model=None, phone_model_dir=model_dir), store=store)
    )
    answer = await client.get("/phone/model/model.json")
    assert answer.status == 200 and answer.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert (await answer.json())["model_id"] == index["model_id"]
    graph = await client.get("/phone/model/dit_cached_kv.onnx")
    assert await graph.read() == (model_dir / "dit_cached_kv.onnx").read_bytes()
    for bad in (
        "/phone/model/%2e%2e/%2e%2e/pyproject.toml",
        "/phone/model/missing.onnx",
        "/phone/vendor/ort/ort.mjs",
        "/phone/vendor/ort/../../package.json",
    ):
        assert (await client.get(bad)).status in (400, 404), bad
    wasm = await client.get("/phone/vendor/ort/ort-wasm-simd-threaded.wasm")
    assert wasm.status == 200 and wasm.headers["Content-Type"] == "application/wasm"
    bare = await aiohttp_client(create_app(ServerConfig(store_dir=store.root, model=None), store=store))
    answer = await bare.get("/phone/model/model.json")
    assert answer.status == 404 and "--phone-model" in (await answer.json())["error"]
