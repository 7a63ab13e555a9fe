"""The page's shard fetch (``phone_web/src/fetch_shard.js``): its node unit tests (resume, restart, refusals,
retries against a scripted server) and a real ``sakura serve`` app on 127.0.0.1: a shard fetched whole behind a read
token, a transfer cut after 3000 bytes resumed with a Range the server answers 206, an unknown digest, a wrong
token."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from ci_deps import require_or_skip

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore

from ..synthetic_templates import SyntheticModel, make_synthetic_template
from .loopback import loopback_server

WEB = Path(__file__).resolve().parents[2] / "phone_web"
NODE = shutil.which("node")
MODEL_ID = "ab" * 32
SCRIPT = """
import { fetchShard } from './src/index.js';
const [base, digest, size, token] = process.argv.slice(1);
const out = {};
const hex = async (b) => Buffer.from(await crypto.subtle.digest('SHA-256', b)).toString('hex');
out.whole = await hex(await fetchShard(base, digest, Number(size), { token }));
const asked = [];
let cut = true;
const cutting = async (url, init) => {  // the real server, the first body broken off after 3000 bytes
  asked.push(init.headers.Range ?? null);
  const resp = await fetch(url, init);
  if (!cut) return resp;
  cut = false;
  const reader = resp.body.getReader();
  let sent = 0;
  const body = new ReadableStream({ async pull(c) {
    const { done, value } = await reader.read();
    if (done || sent >= 3000) { c.error(new Error('connection reset')); return; }
    const part = value.slice(0, 3000 - sent); sent += part.length; c.enqueue(part);
  } });
  return new Response(body, { status: resp.status, headers: resp.headers });
};
out.resumed = await hex(await fetchShard(base, digest, Number(size), { token, fetchImpl: cutting, sleep: async () => {} }));
out.asked = asked;
for (const [name, d, t] of [['missing', '0'.repeat(64), token], ['token', digest, 'wrong']]) {
  try { await fetchShard(base, d, Number(size), { token: t, sleep: async () => {} }); out[name] = 'fetched'; }
  catch (e) { out[name] = e.name; }
}
console.log(JSON.stringify(out));
"""


def _need_node() -> None:
    require_or_skip(NODE is not None, "node is not installed (apt-get install nodejs npm)")


def test_the_node_unit_tests_pass():
    _need_node()
    files = sorted(str(p) for p in (WEB / "test").glob("*.test.mjs"))
    assert files
    proc = subprocess.run([NODE, "--test", *files], capture_output=True, text=True, timeout=120, cwd=WEB)
    assert proc.returncode == 0 and "# fail 0" in proc.stdout, proc.stdout[-3000:]


def test_fetch_from_a_real_server(tmp_path):
    _need_node()
    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, level_bytes=(100, 4096, 8192))
    rep = manifest["shards"][0]["representations"][-1]
    cfg = ServerConfig(store_dir=tmp_path / "store", model=None, read_token="read-token-4567")
    app = create_app(cfg, store=store, model=SyntheticModel(MODEL_ID))
    with loopback_server(app) as base:
        proc = subprocess.run(
            [NODE, "--input-type=module", "-e", SCRIPT, base, rep["digest"], str(rep["bytes"]), "read-token-4567"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=WEB,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["whole"] == out["resumed"] == rep["digest"]
    assert out["asked"] == [None, "bytes=3000-"]
    assert out["missing"] == "ShardNotFoundError" and out["token"] == "AuthError"
