"""Lossy levels in the page: the level select lists the representations every shard of the template offers (with the
edit PSNR its manifest states), and an edit at a SAKURA level fetches that level's chains instead of fp16. Its image
stays within the manifest's stated PSNR of the page's own fp16 edit (``psnr_db``: the lowest output PSNR over the
precompute's held-out edits, each against the edit with exact KV) and equals the Python edit at that level (>= 45 dB;
here pixel for pixel). The edit function's ``level`` may also choose per shard (a fetch policy's hook): the page's
``decodeTemplate`` with a per-shard choice equals each shard decoded at its own level."""

from __future__ import annotations

import json

from .loopback import loopback_server
from .page_driver import SEED, TEMPLATE_ID, fill_edit, finish_edit, open_page, page_state, python_edit, recording_app

LEVEL = "sakura-l4"  # a mid rung: ~35 dB stated, a tenth of fp16's bytes

PER_SHARD = """async ({templateId}) => {
  const t = await import('/phone/src/template.js');
  const { fetchShard } = await import('/phone/src/fetch_shard.js');
  const raw = await (await fetch(`/v1/templates/${templateId}/manifest`)).json();
  const sizes = new Map(raw.shards.flatMap((s) => s.representations.map((r) => [r.digest, r.bytes])));
  const get = (d) => fetchShard(location.origin, d, sizes.get(d));
  const choose = ({ layers }) => (layers[0] < 3 ? 'sakura-l2' : 'fp16');
  const mixed = await t.decodeTemplate(raw, get, choose);
  const low = await t.decodeTemplate(raw, get, 'sakura-l2');
  const high = await t.decodeTemplate(raw, get, 'fp16');
  const same = (a, b) => a.k.length === b.k.length && a.k.every((x, i) => x === b.k[i]) && a.v.every((x, i) => x === b.v[i]);
  let missing = null;
  try { t.templatePlan(raw, ({ layers }) => (layers[0] === 2 ? 'sakura-l99' : 'fp16')); } catch (e) { missing = e.message; }
  return { names: mixed[0].map((p) => p.name),
    equal: mixed[0].map((p, i) => same(p, (p.layers[0] < 3 ? low : high)[0][i])),
    differs: !same(mixed[0][0], high[0][0]), missing,
    planned: t.templatePlan(raw, choose).digests.length };
}"""


def test_a_lossy_level_edit_stays_within_its_stated_psnr(page_store, chromium, tmp_path):
    from PIL import Image

    from sakura_core.metrics import psnr_uint8
    from sakura_core.models.edit_model import load_image

    store, model_dir, model, _ = page_store
    manifest = store.get_manifest(TEMPLATE_ID)
    user = load_image("chelsea", model.spec.image_size)
    photo = tmp_path / "photo.png"
    Image.fromarray(user).save(photo)
    seen: list[dict] = []
    runs = {}
    with loopback_server(recording_app(store, model_dir, seen)) as base:
        page = open_page(chromium, f"{base}/phone")
        for level in ("fp16", LEVEL):
            fill_edit(page, photo, TEMPLATE_ID, level=level)
            options = page.evaluate("Array.from(document.getElementById('level').options, (o) => [o.value, o.text])")
            start = len(seen)
            page.click("#go")
            finish_edit(page)
            runs[level] = page_state(page)
            runs[level]["shards"] = {
                r["path"].removeprefix("/v1/shards/") for r in seen[start:] if r["path"].startswith("/v1/shards/")
            }
        per_shard = page.evaluate(PER_SHARD, {"templateId": TEMPLATE_ID})
    for level, run in runs.items():
        assert run["state"] == "done", (level, run["status"])
    # the select: every level of the manifest, best first, each with its stated PSNR
    stated = {r["name"]: r["psnr_db"] for r in manifest["shards"][0]["representations"]}
    assert [v for v, _ in options] == list(reversed(list(stated)))
    assert dict(options)[LEVEL] == f"{LEVEL} ({stated[LEVEL]:.1f} dB)"
    report = json.loads(runs[LEVEL]["report"])
    assert report["level"] == LEVEL and report["level_psnr_db"] == stated[LEVEL]
    assert report["shard_levels"] == [[LEVEL] * manifest["num_layers"]]
    # what was fetched: each shard's chain up to the level (base first), nothing of fp16
    chains = {
        d
        for s in manifest["shards"]
        for r in s["representations"]
        if r["name"] == LEVEL
        for d in [*r["requires"], r["digest"]]
    }
    assert (
        runs[LEVEL]["shards"] == chains
        and report["bytes_fetched"] < json.loads(runs["fp16"]["report"])["bytes_fetched"] / 5
    )
    lossy, exact = runs[LEVEL]["image"], runs["fp16"]["image"]
    from_fp16 = psnr_uint8(lossy, exact)
    want = python_edit(store, model, user, SEED, TEMPLATE_ID, 0, LEVEL)
    vs_python = psnr_uint8(lossy, want)
    figures = f"{from_fp16:.2f} dB from fp16 (stated {stated[LEVEL]}), {vs_python:.2f} dB vs Python"
    print(f"{LEVEL}: {figures}; {report['bytes_fetched']} B")  # noqa: T201 - the figures of the run (pytest -s)
    assert stated[LEVEL] <= from_fp16 < 60.0  # within the stated PSNR, and lossy indeed
    assert vs_python >= 45.0
    # the per-shard choice: layers < 3 at sakura-l2, the rest fp16, each equal to its own level's decode
    assert per_shard["names"] == ["sakura-l2"] * 3 + ["fp16"] * (manifest["num_layers"] - 3)
    assert all(per_shard["equal"]) and per_shard["differs"]
    assert "has no representation sakura-l99" in per_shard["missing"] and "it offers" in per_shard["missing"]
