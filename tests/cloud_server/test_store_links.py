"""A symbolic link to a *folder* inside the store (``shards/``, ``shards/<aa>/``, ``templates/`` or a template's
folder pointing out of the store) is never followed (issue 28): the server refuses what is under it (a 500 naming
the link, ``Sakura-Retry: no``), the catalog leaves a linked template out, ``store verify`` reports the link and
``store repair`` touches nothing behind it. On main the file-level ``O_NOFOLLOW`` let a linked folder through:
its shards and manifests were served, and repair deleted "orphans" outside the store."""

import hashlib
import shutil

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.fsck import FsckConfig, fsck
from cloud_server.store import LocalStore
from sakura_core.cli import main

from ..synthetic_templates import SyntheticModel, make_synthetic_template
from .conftest import MODEL_ID


@pytest.fixture
def store(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    make_synthetic_template(store, "tpl-b", model_id=MODEL_ID)
    return store


def _move_out(path, outside):
    """Move the folder ``path`` to ``outside`` and leave a symbolic link to it in its place."""
    shutil.move(str(path), str(outside))
    path.symlink_to(outside, target_is_directory=True)


async def _served(aiohttp_client, store):
    cfg = ServerConfig(store_dir=store.root, model=None)
    return await aiohttp_client(create_app(cfg, store=store, model=SyntheticModel(MODEL_ID)))


@pytest.mark.parametrize("linked", ["shards", "shards/aa"])
async def test_a_linked_shard_folder_is_not_served(aiohttp_client, store, tmp_path, linked):
    digest = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    folder = store.shards_dir if linked == "shards" else store.shards_dir / digest[:2]
    _move_out(folder, tmp_path / "outside")
    client = await _served(aiohttp_client, store)
    r = await client.get(f"/v1/shards/{digest}")
    body = await r.json()
    assert r.status == 500 and r.headers["Sakura-Retry"] == "no", body  # main: 200, the bytes from outside
    shown = "shards" if linked == "shards" else f"shards/{digest[:2]}"
    assert body["error"] == (
        f"shard {digest} cannot be read from the store: its folder {shown} is a symbolic link "
        "(the store never follows one)"
    )


@pytest.mark.parametrize("linked", ["templates", "templates/tpl-b"])
async def test_a_linked_template_folder_is_not_listed_nor_served(aiohttp_client, store, tmp_path, linked):
    _move_out(store.root / linked, tmp_path / "outside")
    client = await _served(aiohttp_client, store)
    catalog = await (await client.get("/v1/templates")).json()
    assert [t["id"] for t in catalog["templates"]] == ([] if linked == "templates" else ["tpl-a"])  # main: both
    r = await client.get("/v1/templates/tpl-b/manifest")
    assert r.status == 500 and "is a symbolic link (the store never follows one)" in (await r.json())["error"]


def test_verify_reports_folder_links_and_repair_deletes_nothing_behind_them(store, tmp_path, capsys):
    outside = tmp_path / "outside"
    _move_out(store.shards_dir, outside)
    victim = outside / "ff" / ("f" * 64)  # an "orphan" outside the store
    victim.parent.mkdir()
    victim.write_bytes(b"not the store's")
    report = fsck(store, FsckConfig(repair=True, orphan_age_s=0))
    assert report.unreadable == [
        "shards: a symbolic link to a folder (never followed: the server refuses what is "
        "under it; put the folder itself)"
    ]
    assert victim.exists() and not report.removed and not report.quarantined  # main: repair deleted it
    assert report.shards_checked == 0 and report.missing  # the manifests' shards are not in the store
    assert main(["store", "verify", "--store", str(store.root)]) == 1
    assert "shards: a symbolic link to a folder" in capsys.readouterr().out


def test_verify_reports_a_linked_subfolder_and_a_linked_template(store, tmp_path):
    digest = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    _move_out(store.shards_dir / digest[:2], tmp_path / "out-shards")
    _move_out(store.template_dir("tpl-b"), tmp_path / "out-tpl")
    report = fsck(store)
    assert f"shards/{digest[:2]}: a symbolic link to a folder" in " ".join(report.unreadable)
    assert "templates/tpl-b: a symbolic link to a folder" in " ".join(report.unreadable)
    assert digest in report.missing["tpl-a"] and report.templates_checked == 1


@pytest.mark.parametrize("linked", ["shards", "shards/aa", "templates/tpl-b"])
def test_writes_never_go_through_a_linked_folder(store, tmp_path, linked):
    from cloud_server.store import StoreFaultError

    digest = store.get_manifest("tpl-a")["shards"][0]["representations"][0]["digest"]
    blob = next(b for i in range(100_000) if hashlib.sha256(b := b"new %d" % i).hexdigest()[:2] == digest[:2])
    folder = {"shards": store.shards_dir, "shards/aa": store.shards_dir / digest[:2]}.get(linked)
    outside = tmp_path / "outside"
    _move_out(folder or store.template_dir("tpl-b"), outside)
    before = sorted(outside.rglob("*"))
    with pytest.raises(StoreFaultError, match="it is a symbolic link"):  # main: written outside the store
        if folder is None:
            store.put_manifest("tpl-b", store.get_manifest("tpl-a"))
        else:
            store.put_shard(hashlib.sha256(blob).hexdigest(), blob)  # lands in shards/<aa>/ of the digest
    assert sorted(outside.rglob("*")) == before
