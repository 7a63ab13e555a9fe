"""The page against a server with ``--read-token``, and the ORT-web WASM sent compressed.

Without the token the page shows a clear error (the catalog's 401, saying where the token goes); typed into the
token field, or given as ``/phone#token=TOKEN`` (a fragment: never sent to a server, taken off the address bar at
once), the catalog loads and an edit runs, every API request carrying ``Authorization: Bearer TOKEN`` and no
request path or query carrying the token. The WASM (~15 MB) goes gzip-compressed (about a quarter of its bytes on
the wire) with a strong ETag that a reload revalidates (304, no body), and the page still runs on it."""

from __future__ import annotations

import gzip
import json

from .loopback import loopback_server
from .page_driver import PHOTO_NAME, TEMPLATE_ID, fill_edit, finish_edit, open_page, page_state, recording_app

TOKEN = "page-read-token-5"  # nothing else the page sends could contain this
WASM = "/phone/vendor/ort/ort-wasm-simd-threaded.wasm"


def _state(page) -> tuple[str, str]:
    return page.evaluate(
        "[document.getElementById('status').dataset.state, document.getElementById('status').textContent]"
    )


def test_the_page_sends_the_read_token_and_says_when_it_lacks_one(page_store, chromium, tmp_path):
    from PIL import Image

    from sakura_core.models.edit_model import load_image

    store, model_dir, model, _ = page_store
    photo = tmp_path / PHOTO_NAME
    Image.fromarray(load_image("chelsea", model.spec.image_size)).save(photo)
    seen: list[dict] = []
    wasm: list[dict] = []
    with loopback_server(recording_app(store, model_dir, seen, read_token=TOKEN)) as base:
        bare = open_page(chromium, f"{base}/phone")
        without = _state(bare)
        bare.fill("#token", "not-the-token")
        bare.dispatch_event("#token", "change")
        bare.wait_for_function("document.getElementById('status').textContent.includes('refused')")
        wrong = _state(bare)
        bare.fill("#token", TOKEN)
        bare.dispatch_event("#token", "change")
        bare.wait_for_function("document.getElementById('status').dataset.state !== 'error'")
        typed = _state(bare)
        bare.close()
        page = chromium.new_page(viewport={"width": 412, "height": 915})
        page.on("response", lambda r: wasm.append(r.headers) if r.url.endswith(WASM) else None)
        page.goto(f"{base}/phone#token={TOKEN}")
        page.wait_for_function("document.getElementById('status').dataset.ep", timeout=60_000)
        address = page.evaluate("location.href")
        fill_edit(page, photo, TEMPLATE_ID)
        page.click("#go")
        finish_edit(page)
        done = page_state(page)
        # the token cleared: the catalog is refused again, and the page says why
        page.fill("#token", "")
        page.dispatch_event("#token", "change")
        page.wait_for_function("document.getElementById('status').dataset.state === 'error'")
        cleared = _state(page)
    assert without[0] == "error" and "the catalog answered 401: this server needs a read token" in without[1]
    assert "#token=TOKEN" in without[1]
    assert wrong[0] == "error" and "the read token was refused" in wrong[1]
    assert typed[0] != "error" and typed[1].startswith("Ready"), typed
    assert done["state"] == "done", done["status"]
    assert json.loads(done["report"])["level"] == "fp16"
    assert TOKEN not in address and "#" not in address
    assert cleared[0] == "error" and "the catalog answered 401: this server needs a read token" in cleared[1]
    api = [r for r in seen if r["path"].startswith("/v1/")]
    sent = [r for r in api if r["headers"].get("Authorization") == f"Bearer {TOKEN}"]
    assert {r["path"].split("/")[2] for r in sent} >= {"templates", "shards"}
    assert not any(TOKEN in r["path"] for r in seen)  # never in a path or query (what access logs keep)
    # the WASM came compressed, and the page ran on it
    assert wasm and all(h.get("content-encoding") == "gzip" and h.get("etag") for h in wasm)


async def test_the_wasm_goes_compressed_and_revalidates(page_store, aiohttp_client):
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from cloud_server.phone_page import PHONE_WEB

    store, model_dir, _, _ = page_store
    raw = (PHONE_WEB / "node_modules" / "onnxruntime-web" / "dist" / WASM.rsplit("/", 1)[1]).read_bytes()
    client = await aiohttp_client(
        create_app(ServerConfig(store_dir=store.root, model=None, phone_model_dir=model_dir), store=store),
        auto_decompress=False,
    )
    zipped = await client.get(WASM, headers={"Accept-Encoding": "gzip, deflate"})
    body = await zipped.read()
    assert zipped.status == 200 and zipped.headers["Content-Encoding"] == "gzip"
    assert zipped.headers["Content-Type"] == "application/wasm" and zipped.headers["Vary"] == "Accept-Encoding"
    assert zipped.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert gzip.decompress(body) == raw and len(body) < len(raw) / 3  # the bytes on the wire shrink ~4x
    etag = zipped.headers["ETag"]
    again = await client.get(WASM, headers={"Accept-Encoding": "gzip", "If-None-Match": etag})
    assert again.status == 304 and await again.read() == b"" and again.headers["ETag"] == etag
    plain = await client.get(WASM, headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers and await plain.read() == raw and plain.headers["ETag"] == etag
    other = await client.get(WASM, headers={"Accept-Encoding": "gzip", "If-None-Match": '"0000"'})
    assert other.status == 200 and len(await other.read()) == len(body)
