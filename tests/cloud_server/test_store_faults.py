"""``sakura store verify|repair`` against store faults (issue 28): an unreadable shard or manifest (PermissionError,
as a file of another user or a failing disk gives; the tests run as root, so the read is made to fail), a
nesting-bomb manifest and one past the schema's bounds are reported, never a traceback."""

import json
import os
import stat
import threading

import numpy as np
import pytest

import cloud_server.fsck as fsck_module
from cloud_server.fsck import FsckConfig, fsck
from cloud_server.store import LocalStore
from sakura_core.cli import main

from ..synthetic_templates import make_synthetic_template
from .conftest import MODEL_ID


@pytest.fixture
def store(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    make_synthetic_template(store, "tpl-b", model_id=MODEL_ID)
    return store


def test_an_unreadable_shard_is_reported_and_the_check_goes_on(store, monkeypatch, capsys):
    bad = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    real = fsck_module.file_sha256

    def sha256(path):
        if path.name == bad:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(fsck_module, "file_sha256", sha256)
    report = fsck(store)
    assert len(report.unreadable) == 1 and report.unreadable[0].endswith(": PermissionError: Permission denied")
    assert bad in report.unreadable[0] and report.shards_checked == 24 and not report.missing
    assert main(["store", "verify", "--store", str(store.root)]) == 1
    out = capsys.readouterr().out
    assert f"unreadable shard: shards/{bad[:2]}/{bad}: PermissionError" in out and "problems found" in out
    assert main(["store", "repair", "--store", str(store.root)]) == 1  # only a readable file can be repaired


def test_an_unreadable_manifest_is_a_bad_manifest(store, monkeypatch):
    real = store.get_manifest_bytes

    def get(template_id):
        if template_id == "tpl-b":
            raise PermissionError(13, "Permission denied")
        return real(template_id)

    monkeypatch.setattr(store, "get_manifest_bytes", get)
    report = fsck(store, FsckConfig(repair=True, orphan_age_s=0))
    assert report.bad_manifests == {"tpl-b": "PermissionError: [Errno 13] Permission denied"}
    assert report.templates_checked == 2 and "tpl-a" not in report.bad_manifests


def test_a_hostile_manifest_is_reported_not_raised(store):
    path = store.template_dir("tpl-b") / "manifest.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    report = fsck(store)
    assert report.bad_manifests["tpl-b"].startswith("LimitError: manifest of 'tpl-b': JSON nested 100000 deep")
    manifest = json.loads(store.get_manifest_bytes("tpl-a"))
    manifest["token_grid"] = [100_000, 100_000]  # valid JSON past the schema's bounds: reported, shards kept
    (store.template_dir("tpl-a") / "manifest.json").write_text(json.dumps(manifest))
    report = fsck(store, FsckConfig(repair=True, orphan_age_s=0))
    assert report.bad_manifests["tpl-a"].startswith("ManifestLimitError: manifest field 'token_grid[0]' is 100000")
    named = {r["digest"] for sh in manifest["shards"] for r in sh["representations"]}
    assert named and not named & set(report.orphans)  # repair never deletes the shards a bad manifest names


# ---- the server and the client against store faults -------------------------------------------------------------
@pytest.fixture
async def served(aiohttp_client, store):
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    return await aiohttp_client(create_app(ServerConfig(store_dir=store.root, model=None), store=store))


async def test_one_corrupt_manifest_leaves_the_catalog_to_the_others(served, store):
    (store.template_dir("tpl-b") / "manifest.json").write_bytes(b'{"version": 1, ')
    r = await served.get("/v1/templates")
    assert r.status == 200, await r.text()
    assert [t["id"] for t in (await r.json())["templates"]] == ["tpl-a"]
    r = await served.get("/v1/templates/tpl-b/manifest")
    body = await r.json()
    assert r.status == 500 and r.headers["Sakura-Retry"] == "no" and body["retry"] is False
    assert body["error"].startswith("template 'tpl-b': the store's manifest of 'tpl-b': invalid JSON")


@pytest.mark.parametrize("fault", ["directory", "symlink-out", "no-permission"])
async def test_an_unreadable_shard_is_a_clear_500_the_client_does_not_retry(
    served, store, tmp_path, fault, monkeypatch
):
    from sakura_core.fetch.client import ClientConfig, ShardClient, ShardUnavailableError

    digest = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    path = store.shard_path(digest)
    blob = path.read_bytes()
    path.unlink()
    if fault == "directory":
        path.mkdir()
        says = "it is not a regular file"
    elif fault == "symlink-out":  # the same bytes outside the store: a link is never followed, digest or not
        outside = tmp_path / "outside.bin"
        outside.write_bytes(blob)
        path.symlink_to(outside)
        says = "it is a symbolic link"
    else:  # root reads any mode: make the open fail as it does for another user's file
        path.write_bytes(blob)
        real_open = os.open

        def refuse(p, *args, **kwargs):
            if str(p).endswith(digest):
                raise PermissionError(13, "Permission denied")
            return real_open(p, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
        says = "Permission denied"
    r = await served.get(f"/v1/shards/{digest}")
    body = await r.json()
    assert r.status == 500 and r.headers["Sakura-Retry"] == "no", body
    assert body["error"] == f"shard {digest} cannot be read from the store: {says}" or says in body["error"]
    cfg = ClientConfig(backoff_initial_s=0.2, backoff_max_s=0.2)
    async with ShardClient(str(served.make_url("")).rstrip("/"), config=cfg) as client:
        with pytest.raises(ShardUnavailableError, match=says):
            await client.fetch_shard(digest)
        assert client.stats.attempts == 1  # no retry storm: the server said retrying cannot help


def test_files_are_written_with_the_umask_s_mode(store):
    mask = os.umask(0o022)
    os.umask(mask)
    digest = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    assert stat.S_IMODE(store.shard_path(digest).stat().st_mode) == 0o666 & ~mask  # was 0600 (mkstemp's)
    assert stat.S_IMODE((store.template_dir("tpl-a") / "manifest.json").stat().st_mode) == 0o666 & ~mask


def test_a_concurrent_publish_of_one_id_is_refused_unless_overwrite(store):
    from cloud_server.precompute import TemplateExistsError, publish_template

    from ..synthetic_templates import SyntheticModel, synthetic_precompute

    image = np.zeros((16, 16, 3), np.uint8)

    def racing(model, template_image, template_id, **kwargs):  # another writer publishes the id meanwhile
        publish_template(store, model, template_image + 1, template_id, precompute_fn=synthetic_precompute)
        return synthetic_precompute(model, template_image, template_id, **kwargs)

    with pytest.raises(TemplateExistsError, match="was published by another writer while this one computed it"):
        publish_template(store, SyntheticModel(MODEL_ID), image, "tpl-new", precompute_fn=racing)
    first = store.get_manifest("tpl-new")
    assert first == json.loads(store.get_manifest_bytes("tpl-new"))  # the first writer's manifest stays
    publish_template(
        store, SyntheticModel(MODEL_ID), image, "tpl-new", precompute_fn=synthetic_precompute, overwrite=True
    )
    assert store.get_manifest("tpl-new") != first


def test_put_new_manifest_lets_exactly_one_of_two_racing_writers_win(store):
    from cloud_server.store import ManifestExistsError

    manifest = store.get_manifest("tpl-a")
    barrier, outcomes = threading.Barrier(8), []

    def write(i):
        barrier.wait()
        try:
            store.put_new_manifest("tpl-race", {**manifest, "template_id": "tpl-race", "writer": i})
            outcomes.append("won")
        except ManifestExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 7 + ["won"]
    assert not [p for p in store.template_dir("tpl-race").iterdir() if p.name.endswith(".tmp")]


def test_verify_reports_links_and_a_linked_manifest(store, tmp_path):
    digest = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    path = store.shard_path(digest)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    manifest = store.template_dir("tpl-b") / "manifest.json"
    (tmp_path / "m.json").write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(tmp_path / "m.json")
    report = fsck(store)
    assert report.unreadable == [
        f"shards/{digest[:2]}/{digest}: a symbolic link (the server refuses it; put the file itself)"
    ]
    assert report.bad_manifests["tpl-b"].startswith("StoreFaultError: manifest of template 'tpl-b' cannot be read")
