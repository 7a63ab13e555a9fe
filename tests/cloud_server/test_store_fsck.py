"""A corrupt shard is repaired on republish, and ``sakura store verify|repair`` finds and fixes store damage."""

import json
import os
import time

from cloud_server.fsck import FsckConfig, fsck
from cloud_server.store import LocalStore
from sakura_core.cli import main

from ..synthetic_templates import build_synthetic, make_synthetic_template
from .conftest import MODEL_ID

OLD_S = 2 * 3600  # older than the default grace periods


def _flip_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _age(path, seconds: float = OLD_S) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_put_shard_rewrites_a_corrupt_file_of_the_same_size(tmp_path):
    store = LocalStore(tmp_path / "store")
    t = build_synthetic("tpl-a", model_id=MODEL_ID)
    digest, blob = next(iter(t.blobs.items()))
    store.put_shard(digest, blob)
    path = store.shard_path(digest)
    _flip_byte(path)  # same size, wrong bytes
    store.put_shard(digest, blob)  # republishing (overwrite) must repair it
    assert path.read_bytes() == blob


def _damaged_store(tmp_path):
    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    reps = [r for s in manifest["shards"] for r in s["representations"]]
    corrupt, missing = reps[0]["digest"], reps[1]["digest"]
    _flip_byte(store.shard_path(corrupt))
    store.shard_path(missing).unlink()
    orphan = build_synthetic("tpl-b", model_id=MODEL_ID, seed=9)
    orphan_digest, orphan_blob = next(iter(orphan.blobs.items()))
    store.put_shard(orphan_digest, orphan_blob)
    _age(store.shard_path(orphan_digest))
    young_digest, young_blob = list(orphan.blobs.items())[1]
    store.put_shard(young_digest, young_blob)  # may be a publish in progress: left alone
    tmp = store.shard_path(corrupt).parent / ".x.tmp"
    tmp.write_bytes(b"partial")
    _age(tmp)
    stray = store.root / "shards" / "zz" / "notes.txt"
    stray.parent.mkdir()
    stray.write_text("not a shard")
    (store.root / "templates" / "tpl-bad").mkdir()
    (store.root / "templates" / "tpl-bad" / "manifest.json").write_text("{not json")
    return store, corrupt, missing, orphan_digest, young_digest


def test_verify_reports_and_repair_fixes(tmp_path):
    store, corrupt, missing, orphan, young = _damaged_store(tmp_path)
    report = fsck(store)
    assert report.corrupt == [corrupt]
    assert report.missing == {"tpl-a": [missing]}
    assert report.orphans == [orphan] and young not in report.orphans
    assert len(report.temp_files) == 1 and report.misplaced == ["shards/zz/notes.txt"]
    assert set(report.bad_manifests) == {"tpl-bad"} and not report.clean
    assert store.shard_path(corrupt).exists()  # verify changes nothing

    repaired = fsck(store, FsckConfig(repair=True))
    assert not store.shard_path(corrupt).exists() and not store.shard_path(orphan).exists()
    assert store.shard_path(young).exists()
    assert len(repaired.quarantined) == 2 and all(q.startswith("quarantine/") for q in repaired.quarantined)
    again = fsck(store)
    assert again.corrupt == [] and again.orphans == [] and again.temp_files == [] and again.misplaced == []
    assert again.missing == {"tpl-a": sorted([corrupt, missing])}  # republishing the template restores them


def test_cli_store_verify_and_repair(tmp_path, capsys):
    store, corrupt, *_ = _damaged_store(tmp_path)
    out_json = tmp_path / "fsck.json"
    assert main(["store", "verify", "--store", str(store.root), "--json", str(out_json)]) == 1
    printed = capsys.readouterr().out
    assert f"corrupt shard: {corrupt}" in printed and "problems found" in printed
    assert json.loads(out_json.read_text())["corrupt"] == [corrupt]
    assert main(["store", "repair", "--store", str(store.root)]) == 1  # missing shards need a republish
    assert "quarantined -> quarantine/" in capsys.readouterr().out
    clean = LocalStore(tmp_path / "clean")
    make_synthetic_template(clean, "tpl-a", model_id=MODEL_ID)
    assert main(["store", "verify", "--store", str(clean.root)]) == 0
    assert main(["store", "verify", "--store", str(tmp_path / "nowhere")]) == 2
