"""The page's modules load and decode in a browser too: headless Chromium (Playwright driving Debian's
``chromium``) imports ``phone_web/src/index.js`` through an import map and decodes conformance vectors bit-exact
(a SAKURA chain, a scaled cross-step residual on a lossy reference, a closed-loop twin), refuses a truncated one
and a wrong reference by class, checks a digest with WebCrypto and parses a manifest. Nothing leaves the machine:
every request of the page is answered by Playwright's router from local files (origin ``http://localhost``, a
secure context, as a phone on ``adb reverse`` sees the server)."""

from __future__ import annotations

import json
import mimetypes
import os
import shutil
from pathlib import Path

import pytest
from ci_deps import import_or_skip, require_or_skip

from ..synthetic_templates import SyntheticModel, make_synthetic_template
from .loopback import loopback_server
from .manifest_vectors import write_manifest_vectors
from .vectors import write_vectors

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
if not (shutil.which(CHROMIUM) or Path(CHROMIUM).is_file()):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)", allow_module_level=True)
sync_api = import_or_skip("playwright.sync_api", "the browser test needs playwright (pip install 'sakura-kv[test]')")

WEB = Path(__file__).resolve().parents[2] / "phone_web"
ORIGIN = "http://localhost:8765"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE = """<!doctype html><html><head><script type="importmap">
{"imports": {"fzstd": "/node_modules/fzstd/esm/index.mjs"}}</script></head><body></body></html>"""
CASES = [
    "g1/sakura-l8/chain",
    "g2/sakura-l3/direct",
    "g1/step1/residual-scaled/sakura-l3/ref-sakura-l1",
    "g1/step1/sakura-l6+cl",
    "bad/half",
    "bad-chain/residual-wrong-digest",
    "digest/one-bit-flipped",
]

SCRIPT = """async ({cases, manifest}) => {
  const m = await import('/src/index.js');
  const get = async (name) => new Uint8Array(await (await fetch('/vectors/' + name)).arrayBuffer());
  const f16 = async (name) => new Uint16Array((await get(name)).buffer);
  const out = {};
  for (const c of cases) {
    const blobs = await Promise.all(c.blobs.map(get));
    const ref = c.reference ? {step: c.reference.step, digest: c.reference.digest, k: await f16(c.reference.k),
                               v: await f16(c.reference.v)} : null;
    try {
      if (c.check) await m.checkBlob(blobs[0], c.check.digest, c.check.bytes);
      const {k, v} = await m.decodeChain(blobs, ref);
      const [ek, ev] = [await f16(c.expect.k), await f16(c.expect.v)];
      out[c.name] = k.length === ek.length && k.every((x, i) => x === ek[i]) && v.every((x, i) => x === ev[i])
        ? 'bit-exact' : 'differs';
    } catch (e) { out[c.name] = e.name; }
  }
  out.manifest = m.parseManifestBytes(new TextEncoder().encode(manifest)).kvMode;
  out.secure = window.isSecureContext;
  return out;
}"""


def test_the_modules_decode_in_chromium(tmp_path):
    fzstd = WEB / "node_modules" / "fzstd" / "esm" / "index.mjs"
    require_or_skip(fzstd.exists(), "phone_web's npm packages are not installed (make test runs `npm ci` there)")
    index = write_vectors(tmp_path)
    manifests = write_manifest_vectors(tmp_path)["cases"]
    per_step = next(c for c in manifests if c["name"] == "per-step/valid")["text"]
    cases = [c for c in index["cases"] if c["name"] in CASES]
    assert len(cases) == len(CASES)
    asked = []

    def serve(route):
        path = route.request.url.removeprefix(ORIGIN).split("?")[0]
        asked.append(path)
        if path == "/page.html":
            return route.fulfill(body=PAGE, content_type="text/html")
        base, _, rest = path[1:].partition("/")
        root = {"src": WEB / "src", "node_modules": WEB / "node_modules", "vectors": tmp_path}.get(base)
        file = None if root is None else (root / rest).resolve()
        if file is None or not file.is_file() or root.resolve() not in file.parents:
            return route.fulfill(status=404, body="not found")
        kind = "text/javascript" if file.suffix in (".js", ".mjs") else mimetypes.guess_type(file.name)[0]
        return route.fulfill(body=file.read_bytes(), content_type=kind or "application/octet-stream")

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            page.route("**/*", serve)
            page.goto(f"{ORIGIN}/page.html")
            got = page.evaluate(SCRIPT, {"cases": cases, "manifest": per_step})
        finally:
            browser.close()
    want = {c["name"]: c["expect"].get("error", "bit-exact") for c in cases}
    assert {k: got[k] for k in want} == want, json.dumps(got)
    assert got["manifest"] == "per-step" and got["secure"] is True
    assert "/src/sakura_codec.js" in asked and "/node_modules/fzstd/esm/index.mjs" in asked


def test_sakura_serve_serves_a_page_that_loads_isolated(tmp_path):
    """The page from a real server on 127.0.0.1 (``create_app``, as ``sakura serve`` runs it): its modules load
    through ``/phone``, the COOP/COEP headers make it cross-origin isolated (what WASM threads need), it lists the
    server's catalog and fetches a shard (digest checked with WebCrypto)."""
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from cloud_server.store import LocalStore

    model_id = "ab" * 32
    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl-a", model_id=model_id)
    rep = manifest["shards"][0]["representations"][-1]
    app = create_app(
        ServerConfig(store_dir=tmp_path / "store", model=None), store=store, model=SyntheticModel(model_id)
    )
    with loopback_server(app) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(f"{base}/phone")
            page.wait_for_function("document.getElementById('templates').children.length > 0", timeout=30_000)
            state = page.evaluate("""() => ({ready: document.getElementById('status').dataset.ready,
                isolated: window.crossOriginIsolated, items: [...document.querySelectorAll('li')].map(
                li => li.textContent)})""")
            state["shard"] = page.evaluate(
                """async ([digest, size]) => {
                const m = await import('/phone/src/index.js');
                return m.sha256Hex(await m.fetchShard(location.origin, digest, size));
            }""",
                [rep["digest"], rep["bytes"]],
            )
        finally:
            browser.close()
    assert state == {"ready": "true", "isolated": True, "items": ["tpl-a (single, 4 shards)"], "shard": rep["digest"]}
