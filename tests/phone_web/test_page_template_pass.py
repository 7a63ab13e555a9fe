"""The template pass on the page, layer by layer (``phone_web/src/template_pass.js`` over the export's
``template_embed.onnx`` + ``template_layer_{l}.onnx``), in headless Chromium on fp32 WASM:

* every layer's K/V equals the Python template-only pass (``extract_template_kv``) at the reference time (single KV
  mode) and at a step's flow time (per-step KV mode), to a stated bound; the two times' K/V differ;
* a pass paused after layers 0..2 (another pass run in between) and resumed to layer 5 gives the same K/V, bit for
  bit, as layers 0..5 in one go;
* the on-device edit (every layer computed on the page: split = layers, single and per-step templates) equals the
  Python on-device edit (``run_edit`` with ``split_layer = layers``) to >= 45 dB, the next seed < 40 dB, and fetches
  nothing but the manifest and the template image."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .loopback import loopback_server
from .page_driver import (
    PER_STEP_ID,
    SEED,
    STEPS,
    TEMPLATE_ID,
    fill_edit,
    finish_edit,
    open_page,
    page_state,
    python_edit,
    recording_app,
)

KV_MAX_ABS = 1e-4  # page (ORT-web WASM, fp32) vs torch CPU, any layer; measured about 2e-5

PASS = """async ({tokens, times, pauseAt}) => {
  const at = (p) => new URL(p, document.baseURI).href;
  const ort = await import(at('vendor/ort/ort.wasm.min.mjs'));
  const tp = await import(at('src/template_pass.js'));
  const index = await (await fetch(at('model/model.json'))).json();
  const pass = await tp.loadTemplatePass({ base: at('model/'), index, ort, providers: ['wasm'] });
  const x = Float32Array.from(tokens);
  const all = async (run, n) => { const out = []; for (let i = 0; i < n; i++) out.push(await run.next()); return out; };
  const flat = (layers) => layers.map(({ layer, k, v }) => ({ layer, k: Array.from(k), v: Array.from(v) }));
  const result = { layers: pass.layers, times: [] };
  for (const t of times) { const run = await pass.begin(x, t); result.times.push(flat(await all(run, pass.layers))); run.dispose(); }
  // paused after layers 0..pauseAt-1, another pass run meanwhile, then resumed to the last layer
  const paused = await pass.begin(x, null);
  const first = await all(paused, pauseAt);
  const nextAfterPause = paused.nextLayer;
  const other = await pass.begin(x, times[times.length - 1]);
  await all(other, 2); other.dispose();
  await new Promise((r) => setTimeout(r, 50));
  const rest = await all(paused, pass.layers - pauseAt);
  let done = null;
  try { await paused.next(); } catch (e) { done = e.message; }
  paused.dispose();
  let disposed = null;
  try { await paused.next(); } catch (e) { disposed = e.message; }
  const dropped = await pass.begin(x, null);
  const pending = dropped.next();
  dropped.dispose(); // abandoned with a layer asked for: that layer fails, nothing is kept
  result.abandoned = await pending.then(() => null, (e) => e.message);
  result.resumed = flat([...first, ...rest]);
  Object.assign(result, { nextAfterPause, done, disposed });
  return result;
}"""


def _kv(layers, L, shape):
    """[(layer, k, v)] from the page -> (L, 2, tokens, heads, head_dim) float32."""
    assert [x["layer"] for x in layers] == list(range(L))
    return np.stack([np.stack([np.array(x["k"], np.float32), np.array(x["v"], np.float32)]) for x in layers]).reshape(
        (L, 2, *shape)
    )


def test_the_page_template_pass_equals_python_and_resumes(page_store, chromium):
    import torch

    store, model_dir, model, index = page_store
    a, spec = model.adapter, model.spec
    assert index["template_layers"] is not None and len(index["template_layers"]["layers"]) == a.num_layers
    gen = torch.Generator().manual_seed(5)
    patches = torch.rand(1, spec.num_tokens, spec.patch_dim, generator=gen) * 2 - 1
    tokens = torch.cat([patches, torch.zeros_like(patches)], dim=-1)  # packed as the page packs: patch, then zeros
    step_t = float(torch.linspace(1, 0, STEPS + 1)[1])  # step 1's flow time of the page's schedule (fp32)
    seen: list[dict] = []
    with loopback_server(recording_app(store, model_dir, seen)) as base:
        page = open_page(chromium, f"{base}/phone")
        got = page.evaluate(PASS, {"tokens": tokens.flatten().tolist(), "times": [None, step_t], "pauseAt": 3})
    L, shape = a.num_layers, (spec.num_tokens, a.num_heads, a.head_dim)
    assert got["layers"] == L
    diffs = {}
    for key, t in enumerate((None, step_t)):
        want = a.extract_template_kv(tokens, spec.grid, ref_timestep=t).kv.numpy()  # (L, 2, tok, heads, hd)
        page_kv = _kv(got["times"][key], L, shape)
        diffs[key] = float(np.abs(page_kv - want).max())
        assert diffs[key] <= KV_MAX_ABS, (key, diffs[key])
    single, per_step = _kv(got["times"][0], L, shape), _kv(got["times"][1], L, shape)
    # the time matters: the per-step time's K/V is not the reference time's (the check above can fail)
    assert float(np.abs(single - per_step).max()) > 1e-2
    resumed = _kv(got["resumed"], L, shape)
    assert got["nextAfterPause"] == 3 and np.array_equal(resumed, single)
    assert "all 6 layers computed" in got["done"] and "disposed" in got["disposed"] and "disposed" in got["abandoned"]
    print(f"template pass page vs python max |diff|: {diffs}")  # noqa: T201 - the figures of the run (pytest -s)


@pytest.mark.parametrize(
    ("template_id", "split"), [(TEMPLATE_ID, None), (PER_STEP_ID, None), (PER_STEP_ID, 2), (TEMPLATE_ID, 4)]
)
def test_the_on_device_edit_on_the_page_equals_python(page_store, chromium, tmp_path, template_id, split):
    """``split`` None: every layer computed on the page (the on-device edit); else layers < split computed at any
    layer (4: not the split graph's 3) or per step (a per-step template), the rest fetched."""
    from PIL import Image

    from sakura_core.metrics import psnr_uint8
    from sakura_core.models.edit_model import load_image

    store, model_dir, model, index = page_store
    L = model.adapter.num_layers
    split = L if split is None else split
    user = load_image("chelsea", model.spec.image_size)
    photo = tmp_path / "photo.png"
    Image.fromarray(user).save(photo)
    seen: list[dict] = []
    with loopback_server(recording_app(store, model_dir, seen)) as base:
        page = open_page(chromium, f"{base}/phone")
        splits = page.evaluate("Array.from(document.getElementById('split').options).map((o) => o.value)")
        fill_edit(page, photo, template_id, split=split)
        del seen[:]  # what the edit itself fetches
        page.click("#go")
        finish_edit(page)
        state = page_state(page)
    assert splits == [str(i) for i in range(L + 1)]  # the template pass offers every split
    assert state["state"] == "done", state["status"]
    report = json.loads(state["report"])
    assert report["split_layer"] == split and report["template_pass"] is True
    assert report["kv_mode"] == store.get_manifest(template_id).get("kv_mode", "single")
    got = state["image"]
    want = python_edit(store, model, user, SEED, template_id, split)
    psnr = psnr_uint8(got, want)
    print(  # noqa: T201
        f"{template_id} split {split}: PSNR {psnr:.2f} dB, max |diff| {int(np.abs(got.astype(int) - want).max())}; "
        f"{report['bytes_fetched']} B fetched; {report['timings_s']}"
    )
    assert psnr >= 45.0, psnr
    assert psnr_uint8(got, python_edit(store, model, user, SEED + 1, template_id, split)) < 40.0
    # what the edit fetched: the template image and the fp16 shards of layers >= split (none for the on-device edit)
    manifest = store.get_manifest(template_id)
    want = {
        r["digest"]
        for shard in manifest["shards"]
        if shard["layers"][0] >= split
        for r in shard["representations"]
        if r["name"] == "fp16"
    } | {manifest["template_image"]["digest"]}
    shards = [r["path"].removeprefix("/v1/shards/") for r in seen if r["path"].startswith("/v1/shards/")]
    assert set(shards) == want and len(shards) == len(want)
    if split == L:
        assert report["bytes_fetched"] == manifest["template_image"]["bytes"]
