"""``sakura store verify|repair`` against store faults (issue 28): an unreadable shard or manifest (PermissionError,
as a file of another user or a failing disk gives; the tests run as root, so the read is made to fail), a
nesting-bomb manifest and one past the schema's bounds are reported, never a traceback."""

import json

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
