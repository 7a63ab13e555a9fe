"""Precompute glue: checks the codec's output, stores shards before the manifest, publishes nothing on failure.

The last two tests run the real codec (``sakura_core.precompute.precompute_template``) through ``sakura precompute`` and
``POST /v1/templates``.
"""

import asyncio
import hashlib
import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cloud_server.precompute import ImageError, TemplateExistsError, decode_image, publish_template
from cloud_server.store import LocalStore
from sakura_core.fetch.client import ManifestError, ModelMismatchError

from ..synthetic_templates import SyntheticModel, SyntheticTemplate, build_synthetic, synthetic_precompute

MODEL_ID = "ab" * 32
IMAGE = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)


class RecordingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.calls = []

    def put_shard(self, digest, data):
        self.calls.append("shard")
        super().put_shard(digest, data)

    def put_source_image(self, template_id, data, ext):
        self.calls.append("source")
        super().put_source_image(template_id, data, ext)

    def put_manifest(self, template_id, manifest):
        self.calls.append("manifest")
        super().put_manifest(template_id, manifest)

    def put_new_manifest(self, template_id, manifest):  # what publishing without overwrite calls
        self.calls.append("manifest")
        super().put_new_manifest(template_id, manifest)


def test_publish_writes_every_shard_then_the_manifest(tmp_path):
    store = RecordingStore(tmp_path / "s")
    stages = []
    result = publish_template(
        store,
        SyntheticModel(MODEL_ID),
        IMAGE,
        "tpl",
        precompute_fn=synthetic_precompute,
        progress=lambda s, d, t: stages.append((s, d, t)),
    )
    assert store.calls[-1] == "manifest" and store.calls.count("manifest") == 1
    assert result.shards == 12 and store.calls.count("shard") == 12 + 1  # + the template image blob
    assert store.get_manifest("tpl") == result.manifest
    ref = result.manifest["template_image"]
    image_blob = store.shard_path(ref["digest"]).read_bytes()
    assert len(image_blob) == ref["bytes"] and ref["format"] == "png"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(image_blob))), IMAGE)
    assert ("store", 12, 12) in stages
    png = store.source_image_path("tpl").read_bytes()
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), IMAGE)
    with pytest.raises(TemplateExistsError):
        publish_template(store, SyntheticModel(MODEL_ID), IMAGE, "tpl", precompute_fn=synthetic_precompute)


def _tamper(kind):
    def fn(model, image, template_id, **kw):
        t = build_synthetic(template_id, model_id=model.model_id)
        m, blobs = t.manifest, dict(t.blobs)
        rep = m["shards"][0]["representations"][0]
        if kind == "missing-blob":
            del blobs[rep["digest"]]
        elif kind == "wrong-size":
            rep["bytes"] += 1
        elif kind == "wrong-model":
            m["model_id"] = "cd" * 32
        elif kind == "wrong-template":
            m["template_id"] = "other"
        elif kind == "bad-blob":
            blobs[rep["digest"]] = b"\0" * rep["bytes"]
        return SyntheticTemplate(m, blobs)

    return fn


def test_publish_asks_the_codec_for_the_serving_profile_unless_told(tmp_path):
    """Publishing keeps the serving profile by default (no fp16); ``store_profile="full"`` keeps everything."""
    asked = []

    def recording(model, image, template_id, **kw):
        asked.append(kw["store_profile"])
        return synthetic_precompute(model, image, template_id, **kw)

    store = LocalStore(tmp_path / "s")
    publish_template(store, SyntheticModel(MODEL_ID), IMAGE, "tpl-a", precompute_fn=recording)
    publish_template(store, SyntheticModel(MODEL_ID), IMAGE, "tpl-b", precompute_fn=recording, store_profile="full")
    assert asked == ["serving", "full"]


@pytest.mark.parametrize(
    "kind, error",
    [
        ("missing-blob", ManifestError),
        ("wrong-size", ManifestError),
        ("wrong-model", ModelMismatchError),
        ("wrong-template", ManifestError),
        ("bad-blob", ManifestError),
    ],
)
def test_bad_codec_output_publishes_nothing(tmp_path, kind, error):
    store = LocalStore(tmp_path / "s")
    with pytest.raises(error):
        publish_template(store, SyntheticModel(MODEL_ID), IMAGE, "tpl", precompute_fn=_tamper(kind))
    assert store.list_templates() == []


def test_progress_can_abort(tmp_path):
    store = LocalStore(tmp_path / "s")

    def progress(stage, done, total):
        if stage == "store" and done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish_template(
            store, SyntheticModel(MODEL_ID), IMAGE, "tpl", precompute_fn=synthetic_precompute, progress=progress
        )
    assert store.list_templates() == []


def test_decode_image_limits():
    buf = io.BytesIO()
    Image.fromarray(IMAGE).save(buf, format="JPEG")
    img, ext = decode_image(buf.getvalue(), max_pixels=10_000)
    assert img.shape == (32, 32, 3) and ext == "jpg"
    with pytest.raises(ImageError, match="over the limit"):
        decode_image(buf.getvalue(), max_pixels=100)
    with pytest.raises(ImageError):
        decode_image(b"\x89PNG\r\n\x1a\n garbage", max_pixels=10_000)


# ---- with the real codec --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_precompute_with_the_codec(tmp_path):
    store_dir = tmp_path / "store"
    cmd = [sys.executable, "-m", "sakura_core.cli", "precompute", "--store", str(store_dir), "--model", "demo"]
    proc = subprocess.run([*cmd, "--image", "astronaut", "--id", "astro"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "published astro" in proc.stdout
    store = LocalStore(store_dir)
    manifest = store.get_manifest("astro")
    assert f"model demo ({manifest['model_id'][:16]})" in proc.stdout  # made with the model the CLI loaded
    image = manifest["template_image"]
    assert hashlib.sha256(store.shard_path(image["digest"]).read_bytes()).hexdigest() == image["digest"]
    on_disk = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            blob = store.shard_path(rep["digest"]).read_bytes()
            assert hashlib.sha256(blob).hexdigest() == rep["digest"] and len(blob) == rep["bytes"]
            on_disk[rep["digest"]] = len(blob)
            assert rep["name"] != "fp16"  # the default store profile, serving, keeps no fp16
    # the storage line counts every blob once (a progressive level shares its chain's blobs) against the fp16 KV
    stored = sum(on_disk.values())
    rows, cols = manifest["token_grid"]
    fp16 = manifest["num_layers"] * 2 * rows * cols * manifest["heads"] * manifest["head_dim"] * 2
    assert manifest["store_profile"] == "serving"
    assert (
        f"stored (store profile serving, no fp16): {stored} bytes, {stored / fp16:.3f}x the template's uncompressed "
        f"fp16 KV in single mode ({fp16} bytes; " in proc.stdout
    )
    assert stored < sum(r.get("total_bytes", r["bytes"]) for sh in manifest["shards"] for r in sh["representations"])
    again = subprocess.run(
        [*cmd, "--image", "astronaut", "--id", "astro"], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 1 and "already published" in again.stderr


@pytest.mark.slow
async def test_post_precompute_with_the_codec(aiohttp_client, tmp_path):
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from sakura_core.fetch.client import ShardClient

    token = "write-token-0123"
    app = create_app(ServerConfig(store_dir=tmp_path / "store", model="demo", write_token=token))
    client = await aiohttp_client(app)
    model_id = (await (await client.get("/healthz")).json())["model_id"]
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (80, 96, 3), dtype=np.uint8)).save(buf, format="PNG")
    resp = await client.post(
        "/v1/templates?id=uploaded",
        data=buf.getvalue(),
        headers={"Content-Type": "image/png", "Authorization": f"Bearer {token}"},
    )
    assert resp.status == 202, await resp.text()
    status_url = (await resp.json())["status_url"]
    for _ in range(3000):
        job = await (await client.get(status_url, headers={"Authorization": f"Bearer {token}"})).json()
        if job["state"] in ("done", "failed"):
            break
        await asyncio.sleep(0.1)
    assert job["state"] == "done", job
    async with ShardClient(str(client.make_url("/"))) as shards:
        manifest = await shards.get_manifest("uploaded", expected_model_id=model_id)
        for shard in manifest.shards:
            for rep in shard.representations:
                assert rep.digest is not None  # a single-image template has no reuse rung
                await shards.fetch_shard(rep.digest, expected_bytes=rep.nbytes)


# ---- store profiles and store usage -----------------------------------------------------------------------------
@pytest.mark.slow
def test_store_usage_totals_equal_the_per_template_figures(tmp_path, capsys):
    import argparse
    import json

    from cloud_server import cli_store
    from sakura_core.kv.storage import template_storage
    from sakura_core.models.edit_model import load_demo_model, load_image

    model = load_demo_model(weights=None)
    image = load_image("astronaut", model.spec.image_size)
    store = LocalStore(tmp_path / "store")
    figures = {}
    for tid, profile in (("tpl-serving", "serving"), ("tpl-full", "full")):
        m = publish_template(store, model, image, tid, store_profile=profile).manifest
        figures[tid] = template_storage(m)
        assert figures[tid]["profile"] == profile and figures[tid]["fp16_stored"] == (profile == "full")
    assert figures["tpl-serving"]["stored_bytes"] < figures["tpl-full"]["stored_bytes"]
    out = tmp_path / "usage.json"
    args = argparse.Namespace(action="usage", store=str(tmp_path / "store"), s3_endpoint=None, json=str(out))
    assert cli_store.run(args) == 0
    usage = json.loads(out.read_text())
    assert {r["template_id"]: r for r in usage["templates"]} == figures
    assert usage["total"]["stored_bytes"] == sum(f["stored_bytes"] for f in figures.values())
    assert usage["total"]["fp16_kv_bytes"] == sum(f["fp16_kv_bytes"] for f in figures.values())
    by = {(t["kv_mode"], t["profile"]): t["stored_bytes"] for t in usage["by"]}
    assert by == {("single", p): figures[f"tpl-{p}"]["stored_bytes"] for p in ("serving", "full")}
    # a blob's header names its template: two templates share no blob, so each is counted once either way
    assert usage["total"]["distinct_bytes"] == usage["total"]["stored_bytes"]
    printed = capsys.readouterr().out
    assert "tpl-serving" in printed and "serving" in printed and str(usage["total"]["stored_bytes"]) in printed
    bad = argparse.Namespace(action="usage", store=str(tmp_path), s3_endpoint=None, json=None)
    assert cli_store.run(bad) == 2
