"""kill -9 in the middle of a publish into a real radosgw leaves the bucket readable (the old manifest or the new,
never a mix), and ``sakura store verify`` is clean after ``repair``.

A gate proxy between the writer and the radosgw holds the manifest PUT (or sends half of it on and cuts it), so the
kill lands at an exact point: every shard stored, the manifest not (yet) replaced.
"""

import asyncio
import hashlib
import io
import json
import os
import signal
import sys

import aiohttp
import numpy as np
import pytest
from PIL import Image

from sakura_core.fetch.client import ShardClient

from ..synthetic_templates import make_synthetic_template

pytestmark = pytest.mark.slow

MODEL_ID = "ab" * 32
TOKEN = "crash-test-token"


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


async def _readable(sakura_serve, store, template_ids: list[str], endpoint: str) -> dict[str, dict]:
    """A fresh replica over the bucket lists exactly ``template_ids``, and every shard they name verifies."""
    proc, port = await sakura_serve(str(store.location), "--model", "none", endpoint=endpoint)
    try:
        async with ShardClient(f"http://127.0.0.1:{port}") as client:
            catalog = await client.get_catalog()
            assert sorted(t["id"] for t in catalog["templates"]) == sorted(template_ids)
            manifests = {tid: await client.get_manifest(tid) for tid in template_ids}
            for manifest in manifests.values():
                for shard in manifest.shards:
                    for rep in shard.representations:
                        if rep.digest is None:  # a reuse rung: no blob of its own
                            continue
                        data = await client.fetch_shard(rep.digest, expected_bytes=rep.nbytes)
                        assert hashlib.sha256(data).hexdigest() == rep.digest
        return manifests
    finally:
        await sakura_serve.stop(proc)


async def _verify_repair_verify(sakura_cli, store, endpoint: str) -> None:
    args = ["--store", str(store.location), "--s3-endpoint", endpoint, "--orphan-age-s", "0"]
    rc, out = await sakura_cli("store", "verify", *args)
    assert rc == 1 and "orphan shard" in out, out  # the killed publish's shards: stored, named by no manifest
    rc, out = await sakura_cli("store", "repair", *args)
    assert rc == 0 and "removed shards/" in out, out
    rc, out = await sakura_cli("store", "verify", *args)
    assert rc == 0 and out.strip().endswith("clean"), out


async def test_kill_serve_mid_publish_leaves_the_bucket_readable(radosgw, s3_gate, sakura_serve, sakura_cli):
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/crash-serve-{os.getpid()}", endpoint_url=radosgw.endpoint_url)
    old = make_synthetic_template(store, "keep", model_id=MODEL_ID)
    hold = s3_gate.hold("PUT", r"/templates/new-tpl/manifest\.json$")
    proc, port = await sakura_serve(str(store.location), "--model", "demo", "--token", TOKEN, endpoint=s3_gate.url)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/templates?id=new-tpl",
                data=_png(1),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "image/png"},
            ) as r:
                assert r.status == 202, await r.text()
        await asyncio.wait_for(hold.arrived.wait(), 240)
        shard_puts = [p for m, p in s3_gate.seen if m == "PUT" and "/shards/" in p]
        assert len(shard_puts) > 10  # every shard went in before the manifest
        os.kill(proc.pid, signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
        hold.release(forward=False)  # the writer is gone: its manifest PUT never reaches S3
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    manifests = await _readable(sakura_serve, store, ["keep"], radosgw.endpoint_url)
    assert manifests["keep"].to_json() == old
    await _verify_repair_verify(sakura_cli, store, radosgw.endpoint_url)
    assert store.list_templates() == ["keep"]


async def test_kill_precompute_mid_manifest_put_keeps_the_old_manifest(radosgw, s3_gate, sakura_serve, sakura_cli):
    """``sakura precompute --overwrite`` of a published template, killed while half its new manifest has reached
    the radosgw: readers keep getting the old manifest whole, with all its shards."""
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/crash-pc-{os.getpid()}", endpoint_url=radosgw.endpoint_url)
    make_synthetic_template(store, "tpl", model_id=MODEL_ID)  # the published version (any model's)
    old_raw = store.get_manifest_bytes("tpl")
    args = ["--store", str(store.location), "--id", "tpl", "--model", "demo"]
    hold = s3_gate.hold("PUT", r"/templates/tpl/manifest\.json$", cut=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sakura_core.cli",
        "precompute",
        *args,
        "--image",
        "coffee",
        "--overwrite",
        "--s3-endpoint",
        s3_gate.url,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.wait_for(hold.arrived.wait(), 240)
        await asyncio.sleep(0.5)  # half the body is at the radosgw, then the connection is cut
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        hold.release(forward=False)
    assert store.get_manifest_bytes("tpl") == old_raw  # not a byte of the cut PUT is visible
    manifests = await _readable(sakura_serve, store, ["tpl"], radosgw.endpoint_url)
    assert manifests["tpl"].to_json() == json.loads(old_raw)
    await _verify_repair_verify(sakura_cli, store, radosgw.endpoint_url)
