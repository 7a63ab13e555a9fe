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

from sakura_tools.bench.page_link import TraceLink

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
    store_blobs,
)

CODES = {
    "never-fetches",
    "fp16-exact",
    "fp16-nearest",
    "probe",
    "probe-waits",
    "past-compute",
    "defer",
    "floor",
    "target",
    "drop",
    "recompute",
    "upgrade",
    "device",
}


SHARD_KV_BYTES = 2 * 64 * 6 * 64 * 4  # one layer's float32 K and V of the demo template: 64 tokens, 6 heads x 64
# (checked against the report below)


PASS_KV = ("template", "device")  # the levels of the layers the template pass computed


def _done(page) -> bool:
    return page.evaluate("['done', 'error'].includes(document.getElementById('status').dataset.state)")


def python_at_levels(store, model, user, template_id: str, levels_used: list[list[str]]):
    """The Python edit with, at each step and layer, the KV of the level the page reports it used there (``template``:
    the template pass's, which the oracle pass of ORACLE_PASS gives at fp16)."""
    from sakura_core.kv.template_codec import decode_template
    from sakura_core.runtime.denoise import run_edit

    manifest = store.get_manifest(template_id)
    blobs = store_blobs(store, manifest)
    pass_kv = PASS_KV  # the template pass's KV (kept, or racing a late shard): fp16 for an oracle pass
    levels_used = [["fp16" if n in pass_kv else n for n in step] for step in levels_used]
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


@pytest.mark.parametrize(
    ("template_id", "policy"), [(TEMPLATE_ID, "sakura"), (TEMPLATE_ID, "fetch-fp16"), (PER_STEP_ID, "fetch-fp16")]
)
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
    if policy == "fetch-fp16":  # the template pass dropped at once (the page has one: "drop"), every shard at fp16
        assert (
            "fp16-exact" in codes
            and codes <= {"fp16-exact", "drop"}
            and all(n == "fp16" for step in used for n in step)
        )
    else:  # step 0 planned on the template image's seed where the page fetched it before the lanes (no bandwidth
        # probe; on the probe without it), then every fetched shard at the quality floor (>= 35 dB stated), refined
        # on the idle link; the layers the template pass kept are computed here
        stated = {r["name"]: r["psnr_db"] for r in manifest["shards"][0]["representations"]}
        fetched = [n for step in used for n in step if n not in PASS_KV]
        seeded = report["timings_s"]["template_image"] > 0.001  # the image's GET before the lanes
        assert ("probe" in codes) != seeded and ("probe-waits" in codes) <= ("probe" in codes), codes
        assert ("floor" in codes or not fetched) and stated[report["floor"]] >= 35.0
        assert all(n == "fp16" or stated[n] >= 35.0 for n in fetched)
    # the lanes overlap: a transfer or a decode runs while a DiT step does (single KV: the idle link's upgrades)
    if policy == "sakura" or template_id == PER_STEP_ID:
        assert _overlaps(tl, "fetch") or _overlaps(tl, "decode"), tl
    assert state["scroll"] <= 412


def test_per_step_kv_is_freed_and_the_prefetch_keeps_to_its_budget(page_store, chromium, tmp_path):
    """A fast (unshaped) link and a 4x slower CPU: the fetch lane runs ahead of the DiT steps (in onnxruntime-web's
    proxy worker). Under a budget of two shards' K/V the KV held for later steps never exceeds it (and some is held
    ahead), the KV held never exceeds one step's plus it, and none is held once the edit is done. (That the budget
    is what bounds it, on a deterministic clock: phone_web/test/run_lanes.mjs.)"""
    from PIL import Image

    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = page_store
    photo = tmp_path / "photo.png"
    Image.fromarray(load_image("chelsea", model.spec.image_size)).save(photo)
    budget = 2 * SHARD_KV_BYTES
    seen: list[dict] = []
    with loopback_server(recording_app(store, model_dir, seen)) as base:
        page = open_page(chromium, f"{base}/phone?budget={budget}")
        fill_edit(page, photo, PER_STEP_ID)
        page.select_option("#policy", "fetch-fp16")
        cdp = page.context.new_cdp_session(page)
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
        before = len(seen)
        page.click("#go")
        finish_edit(page)
        state = page_state(page)
    assert state["state"] == "done", state["status"]
    report = json.loads(state["report"])
    mem = report["memory"]
    figures = f"per-step prefetch peak {mem['peak_prefetch_bytes']} B under {budget} B; held peak "
    print(f"{figures}{mem['peak_held_bytes']} B; {report['where']}")  # noqa: T201 - the figures of the run
    assert "proxy worker" in report["where"]["compute"]
    assert mem["shard_kv_bytes"] == SHARD_KV_BYTES and mem["budget_applies"] and mem["budget_bytes"] == budget
    step_bytes = index["layers"] * SHARD_KV_BYTES
    assert 0 < mem["peak_prefetch_bytes"] <= budget
    assert mem["peak_held_bytes"] > step_bytes  # a whole step's KV and some of the next, then freed
    assert all(held <= step_bytes + budget for _, held, _ in mem["held_samples"])
    assert mem["held_bytes_at_end"] == 0
    # the manifest came with the template's choice (the page's prefetch), not on the edit's path
    assert report["manifest_prefetched"] and report["manifest_get_s"] > 0
    assert not any(r["path"].endswith("/manifest") for r in seen[before:]), [r["path"] for r in seen[before:]]
    assert any(r["path"] == f"/v1/templates/{PER_STEP_ID}/manifest" for r in seen[:before])


# runEdit in the page with an oracle template pass (the interface of template_pass.js): each layer's K/V is what the
# template's fp16 shards hold at the step the pass is begun for (the real pass computes them to fp16 tolerance), after
# a 40 ms wait per layer; the policy plans with a fixed profile (the template dearer than the link)
ORACLE_PASS = (
    """async ({ templateId, policy, photo }) => {
  const w = await import('/phone/src/web_model.js');
  const t = await import('/phone/src/template.js');
  const { fetchShard } = await import('/phone/src/fetch_shard.js');
  const { f16Table } = await import('/phone/src/f16.js');
  const edit = await import('/phone/src/edit.js');
  const model = await w.loadWebModel('/phone/model/');
  const loadOrt = async () => { const ort = await import('/phone/vendor/ort/ort.wasm.min.mjs');
    ort.env.wasm.wasmPaths = new URL('/phone/vendor/ort/', location.href).href; ort.env.wasm.numThreads = 1;
    ort.env.wasm.proxy = true; return ort; };
  const run = await w.createSession(loadOrt, model.graph, ['wasm']);
  const raw = await (await fetch(`/v1/templates/${templateId}/manifest`)).json();
  const sizes = new Map(raw.shards.flatMap((s) => s.representations.map((r) => [r.digest, r.bytes])));
  const kv = await t.decodeTemplate(raw, (d) => fetchShard(location.origin, d, sizes.get(d)), 'fp16');
  const table = f16Table();
  const wide = (a) => Float32Array.from(a, (x) => table[x]);
  const times = Array.from(w.flowTimes(3));
  const calls = [];
  const pass = { layers: raw.num_layers, async begin(tokens, time) {
    const step = time === null ? 0 : times.findIndex((x) => Math.abs(x - time) < 1e-6);
    calls.push({ tokens: tokens.length, time, step });
    return { nextLayer: 0, async next() { const l = this.nextLayer++; await new Promise((r) => setTimeout(r, 40));
      return { layer: l, k: wide(kv[step][l].k), v: wide(kv[step][l].v) }; }, dispose() {} };
  } };
  const profile = { layerFullS: 0.1, layerCachedS: 0.02, templatePassS: 0.4, fixedS: 0, steps: 3, ditCpuCores: 1 };
  const out = await edit.runEdit({ origin: location.origin, templateId, rgba: Uint8ClampedArray.from(photo),
    prompt: '"""
    + "PROMPT_HERE"
    + """', steps: 3, seed: 11, model, run, policy, templatePass: pass, profile });
  return { report: out.report, calls, pixels: Array.from(out.rgba) };
}"""
)


@pytest.mark.parametrize("policy", ["on-device", "sakura"])
def test_a_template_pass_computes_the_layers_the_policy_keeps(page_store, chromium, policy):
    """With a template pass (an oracle one: the interface of template_pass.js) the compute lane asks the policy per
    layer: on-device computes every layer of every step with it and fetches nothing; sakura keeps it while its plan
    says so and fetches the rest; the pass is begun at each step's own time with the template's packed tokens, the
    layers it ran are compute events, and the image equals the Python edit with those layers' exact KV."""
    import numpy as np

    from sakura_core.metrics import psnr_uint8
    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = page_store
    user = load_image("chelsea", model.spec.image_size)
    photo = np.concatenate([user, np.full((*user.shape[:2], 1), 255, np.uint8)], axis=2).reshape(-1).tolist()
    with loopback_server(recording_app(store, model_dir, [])) as base:
        page = open_page(chromium, f"{base}/phone")
        out = page.evaluate(
            ORACLE_PASS.replace("PROMPT_HERE", PROMPT), {"templateId": PER_STEP_ID, "policy": policy, "photo": photo}
        )
    report, L = out["report"], index["layers"]
    used, splits = report["shard_levels"], report["split_layers"]
    got = np.array(out["pixels"], np.uint8).reshape(*user.shape[:2], 4)[..., :3]
    psnr = psnr_uint8(got, python_at_levels(store, model, user, PER_STEP_ID, used))
    print(f"template pass, {policy}: splits {splits}, PSNR {psnr:.2f} dB, pass calls {out['calls']}")  # noqa: T201
    assert psnr >= 45.0, psnr
    assert report["template_pass"] == "given" and len(splits) == STEPS
    assert all((n == "template") == (layer < splits[s]) for s, step in enumerate(used) for layer, n in enumerate(step))
    ran = [e for e in report["timeline"] if e["lane"] == "compute" and e["level"] == "template"]
    assert len(ran) == sum(splits)
    late = sum(n == "device" for step in used for n in step)  # a late shard the policy raced a resumed pass against
    assert late == 0 or {"recompute"} <= {d["code"] for d in report["decisions"]}
    assert [c["step"] for c in out["calls"]] == [s for s in range(STEPS) if splits[s] > 0 or "device" in used[s]]
    assert all(c["tokens"] == index["image_tokens"] * index["in_channels"] for c in out["calls"])
    drops = [d for d in report["decisions"] if d["code"] == "drop"]
    assert len(drops) == sum(k < L for k in splits)
    if policy == "on-device":
        image = store.get_manifest(PER_STEP_ID)["template_image"]["bytes"]  # its tokens: the only bytes fetched
        assert splits == [L] * STEPS and report["bytes_fetched"] == image and not drops
        assert not [e for e in report["timeline"] if e["lane"] == "fetch"]
        assert {d["code"] for d in report["decisions"]} == {"never-fetches"}
    else:
        assert report["bytes_fetched"] > 0 and any(n == "fp16" for step in used for n in step)
