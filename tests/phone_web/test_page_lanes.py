"""The page's pipelined lanes (``phone_web/src/lanes``) driven by the page's policy, in headless Chromium: the edit's
link shaped by CDP from a synthetic trace and the CPU throttled 4x, as ``test_page_edit.py``. ``fetch-fp16`` and
``sakura`` give the image of the Python edit with the KV each step used at the levels the page reports (>= 45 dB);
the report's timeline shows a transfer or decode overlapping a DiT step, every decision carries a reason code, the
timeline is drawn on the page (one bar per event) without horizontal scrolling; with per-step KV under a memory
budget the KV held for later steps never exceeds it, the KV held never exceeds one step's plus the budget, and none
is held once the edit is done."""

from __future__ import annotations

import json

import pytest

from .link_trace import TraceLink
from .loopback import loopback_server
from .page_driver import (
    PER_STEP_ID,
    PROMPT,
    SEED,
    STEPS,
    TEMPLATE_ID,
    fill_edit,
    finish_edit,
    open_page,
    page_state,
    recording_app,
)

CODES = {"never-fetches", "fp16-exact", "fp16-nearest", "probe", "probe-waits", "past-compute", "defer", "floor",
         "target", "drop", "recompute", "upgrade", "device"}  # fmt: skip


SHARD_KV_BYTES = 2 * 64 * 6 * 64 * 4  # one layer's float32 K and V of the demo template: 64 tokens, 6 heads x 64
# (checked against the report below)


def _done(page) -> bool:
    return page.evaluate("['done', 'error'].includes(document.getElementById('status').dataset.state)")


def python_at_levels(store, model, user, template_id: str, levels_used: list[list[str]]):
    """The Python edit with, at each step and layer, the KV of the level the page reports it used there."""
    from sakura_core.kv.template_codec import decode_template
    from sakura_core.runtime.denoise import run_edit

    manifest = store.get_manifest(template_id)
    blobs = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            if rep["digest"] is not None:
                f, _ = store.open_shard(rep["digest"])
                with f:
                    blobs[rep["digest"]] = f.read()
    kvs = {name: decode_template(manifest, blobs, name) for name in {n for step in levels_used for n in step}}
    per_step = manifest.get("kv_mode", "single") == "per-step"

    def source(layer: int, step: int):
        kv = kvs[levels_used[step][layer]]
        if per_step:
            return kv.kv[step, layer, 0].unsqueeze(0), kv.kv[step, layer, 1].unsqueeze(0)
        return kv.layer(layer)

    mode = "per-step" if per_step else "single"
    return run_edit(model, user, PROMPT, steps=STEPS, seed=SEED, split_layer=0, kv_source=source, kv_mode=mode).image


def _overlaps(timeline: list[dict], lane: str) -> bool:
    steps = [e for e in timeline if e["lane"] == "compute"]
    return any(e["start"] < c["end"] and c["start"] < e["end"] for e in timeline if e["lane"] == lane for c in steps)


@pytest.mark.parametrize(("template_id", "policy"), [(TEMPLATE_ID, "sakura"), (TEMPLATE_ID, "fetch-fp16"),
                                                   (PER_STEP_ID, "fetch-fp16")])  # fmt: skip
def test_the_lanes_edit_equals_python_and_overlap(page_store, link_trace, chromium, tmp_path, template_id, policy):
    from PIL import Image

    from sakura_core.metrics import psnr_uint8
    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = page_store
    user = load_image("chelsea", model.spec.image_size)
    photo = tmp_path / "photo.png"
    Image.fromarray(user).save(photo)
    with loopback_server(recording_app(store, model_dir, [])) as base:
        page = open_page(chromium, f"{base}/phone")
        fill_edit(page, photo, template_id)
        page.select_option("#policy", policy)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
        link = TraceLink(page, cdp, link_trace, latency_ms=40, time_scale=0.25)
        link.run(lambda: page.click("#go"), lambda: _done(page))
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
        state = page_state(page)
        bars = page.evaluate("Number(document.getElementById('lanes').dataset.bars)")
    assert state["state"] == "done", state["status"]
    report = json.loads(state["report"])
    used = report["shard_levels"]
    want = python_at_levels(store, model, user, template_id, used)
    psnr = psnr_uint8(state["image"], want)
    tl = report["timeline"]
    figures = (
        f"lanes {template_id} {policy}: PSNR {psnr:.2f} dB vs Python at {used}; busy {report['busy_s']}; "
        f"memory peak {report['memory']['peak_held_bytes']} prefetch {report['memory']['peak_prefetch_bytes']}; "
        f"{len(tl)} events, {len(report['decisions'])} decisions, {report['where']}"
    )
    print(figures)  # noqa: T201 - the figures of the run (pytest -s)
    assert psnr >= 45.0, psnr
    assert report["policy"] == policy and len(used) == STEPS
    assert {e["lane"] for e in tl} >= {"fetch", "decode", "compute"} and bars == len(tl)
    codes = {d["code"] for d in report["decisions"]}
    assert codes <= CODES and all(d["reason"] for d in report["decisions"])
    manifest = store.get_manifest(template_id)
    if policy == "fetch-fp16":
        assert codes == {"fp16-exact"} and all(n == "fp16" for step in used for n in step)
    else:  # the bandwidth probe, then every shard at the quality floor (>= 35 dB stated), refined on the idle link
        stated = {r["name"]: r["psnr_db"] for r in manifest["shards"][0]["representations"]}
        assert {"probe", "floor"} <= codes and stated[report["floor"]] >= 35.0
        assert all(n == "fp16" or stated[n] >= 35.0 for step in used for n in step)
    # the lanes overlap: a transfer or a decode runs while a DiT step does (single KV: the idle link's upgrades)
    if policy == "sakura" or template_id == PER_STEP_ID:
        assert _overlaps(tl, "fetch") or _overlaps(tl, "decode"), tl
    assert state["scroll"] <= 412


def test_per_step_kv_is_freed_and_the_prefetch_keeps_to_its_budget(page_store, chromium, tmp_path):
    """A fast (unshaped) link and a 4x slower CPU: the fetch lane runs ahead of the DiT steps (in onnxruntime-web's
    proxy worker). Under a budget of three shards' K/V the KV held for later steps reaches it and never exceeds it,
    the KV held never exceeds one step's plus it; without the page's budget the lane holds more ahead (the budget is
    what bounded it); no KV is held once the edit is done."""
    from PIL import Image

    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = page_store
    photo = tmp_path / "photo.png"
    Image.fromarray(load_image("chelsea", model.spec.image_size)).save(photo)
    budget = 3 * SHARD_KV_BYTES
    mems = {}
    with loopback_server(recording_app(store, model_dir, [])) as base:
        for cap in (None, budget):
            page = open_page(chromium, f"{base}/phone" + (f"?budget={cap}" if cap else ""))
            fill_edit(page, photo, PER_STEP_ID)
            page.select_option("#policy", "fetch-fp16")
            cdp = page.context.new_cdp_session(page)
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
            page.click("#go")
            finish_edit(page)
            state = page_state(page)
            assert state["state"] == "done", state["status"]
            report = json.loads(state["report"])
            mems[cap] = report["memory"]
            page.close()
    free, mem = mems[None], mems[budget]
    figures = (
        f"per-step prefetch peak: {free['peak_prefetch_bytes']} B unbounded, {mem['peak_prefetch_bytes']} B under "
    )
    print(f"{figures}{budget} B; held peak {mem['peak_held_bytes']} B; {report['where']}")  # noqa: T201 - the figures
    assert "proxy worker" in report["where"]["compute"]
    assert mem["shard_kv_bytes"] == SHARD_KV_BYTES and mem["budget_applies"] and mem["budget_bytes"] == budget
    step_bytes = index["layers"] * SHARD_KV_BYTES
    assert free["peak_prefetch_bytes"] > budget
    assert 0 < mem["peak_prefetch_bytes"] <= budget
    assert mem["peak_held_bytes"] > step_bytes  # a whole step's KV and some of the next, then freed
    assert all(held <= step_bytes + budget for _, held, _ in mem["held_samples"])
    assert mem["held_bytes_at_end"] == 0 and free["held_bytes_at_end"] == 0
