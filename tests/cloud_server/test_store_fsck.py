"""A corrupt shard is repaired on republish, and ``sakura store verify|repair`` finds and fixes store damage."""

import hashlib
import json
import os
import time

from cloud_server.fsck import FsckConfig, fsck
from cloud_server.store import LocalStore
from sakura_core.cli import main

from ..synthetic_templates import build_cross_step_synthetic, build_synthetic, make_synthetic_template
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


def test_each_reference_image_is_kept(tmp_path):
    """A template of two references (try-on: person + garment) names both images: repair keeps the second one."""
    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    images = []
    for name in ("person", "garment"):
        png = f"PNG of the {name}".encode()
        images.append({"digest": hashlib.sha256(png).hexdigest(), "bytes": len(png), "format": "png"})
        store.put_shard(images[-1]["digest"], png)
        _age(store.shard_path(images[-1]["digest"]))
    assert sorted(fsck(store).orphans) == sorted(i["digest"] for i in images)  # named by no manifest yet
    refs = [
        {
            "name": name,
            "size": [64, 64],
            "token_grid": [16, 16],
            "rope_t": 10 * (i + 1),
            "token_offset": 256 * i,
            "tokens": 256,
            "image": images[i],
        }
        for i, name in enumerate(("person", "garment"))
    ]
    two = {
        **manifest,
        "token_grid": [32, 16],
        "rope_layout": "flux2-ref-t10-x2",
        "template_image": images[0],
        "references": refs,
    }
    store.put_manifest("tpl-a", two)
    assert fsck(store).bad_manifests == {}  # a valid manifest of two references (the schema's check)
    fsck(store, FsckConfig(repair=True))
    assert all(store.shard_path(i["digest"]).exists() for i in images)
    assert fsck(store).clean


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


def test_a_version_1_manifest_is_reported_with_the_fix_and_its_shards_kept(tmp_path):
    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl-old", model_id=MODEL_ID)
    path = store.root / "templates" / "tpl-old" / "manifest.json"
    path.write_text(json.dumps({**manifest, "version": 1}))  # published before shard format 2
    for digest in (r["digest"] for s in manifest["shards"] for r in s["representations"]):
        _age(store.shard_path(digest))
    report = fsck(store, FsckConfig(repair=True))
    assert "republish" in report.bad_manifests["tpl-old"] and "sakura precompute" in report.bad_manifests["tpl-old"]
    assert not report.orphans and not report.removed  # still referenced: republishing needs nothing deleted


def test_a_cross_step_manifests_blob_less_reuse_rung_is_not_missing(tmp_path):
    store = LocalStore(tmp_path / "store")
    t = build_cross_step_synthetic("tpl-xs", model_id=MODEL_ID)
    for digest, blob in t.blobs.items():
        store.put_shard(digest, blob)
    store.put_manifest("tpl-xs", t.manifest)
    assert any(r["digest"] is None for s in t.manifest["shards"] for r in s["representations"])  # the reuse rung
    report = fsck(store, FsckConfig())
    assert "tpl-xs" not in report.bad_manifests and not report.missing
