"""LocalStore: name validation, content addressing, and atomic publication under a real crash (SIGKILL)."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloud_server.store import (
    DigestMismatchError,
    InvalidNameError,
    LocalStore,
    NotFoundError,
    validate_digest,
    validate_template_id,
)

from ..synthetic_templates import build_synthetic


@pytest.mark.parametrize("good", ["a", "a-b-9", "0" * 64, "-"])
def test_valid_template_ids(good):
    assert validate_template_id(good) == good


@pytest.mark.parametrize("bad", ["", "A", "a_b", "a/b", "..", "../x", "a\x00", "a" * 65, "é", None, 7, "a\n"])
def test_invalid_template_ids(bad):
    with pytest.raises(InvalidNameError):
        validate_template_id(bad)


@pytest.mark.parametrize("bad", ["", "0" * 63, "0" * 65, "A" * 64, "g" * 64, "../" + "0" * 61, None, "0" * 63 + "\n"])
def test_invalid_digests(bad):
    with pytest.raises(InvalidNameError):
        validate_digest(bad)


def test_roundtrip_and_layout(tmp_path):
    store = LocalStore(tmp_path / "s")
    data = b"hello shard"
    digest = hashlib.sha256(data).hexdigest()
    store.put_shard(digest, data)
    store.put_shard(digest, data)  # idempotent
    assert (tmp_path / "s" / "shards" / digest[:2] / digest).read_bytes() == data
    f, size = store.open_shard(digest)
    with f:
        assert size == len(data) and f.read() == data
    store.put_manifest("t-1", {"version": 1})
    store.put_source_image("t-1", b"png", "png")
    assert store.list_templates() == ["t-1"]
    assert store.get_manifest("t-1") == {"version": 1}
    assert store.source_image_path("t-1").read_bytes() == b"png"
    with pytest.raises(NotFoundError):
        store.open_shard("0" * 64)
    with pytest.raises(NotFoundError):
        store.get_manifest_bytes("missing")


def test_mismatched_digest_is_refused_and_nothing_written(tmp_path):
    store = LocalStore(tmp_path / "s")
    with pytest.raises(DigestMismatchError):
        store.put_shard("0" * 64, b"not zero")
    assert not any((tmp_path / "s" / "shards").rglob("*"))


def test_invalid_names_never_reach_the_filesystem(tmp_path):
    store = LocalStore(tmp_path / "s")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for call in (
        lambda: store.open_shard("../../secret"),
        lambda: store.get_manifest_bytes("../secret"),
        lambda: store.put_manifest("../evil", {}),
        lambda: store.put_source_image("a/b", b"x", "png"),
        lambda: store.has_shard("/etc/passwd"),
    ):
        with pytest.raises(InvalidNameError):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_listing_ignores_unpublished_folders_and_temp_files(tmp_path):
    store = LocalStore(tmp_path / "s")
    (tmp_path / "s" / "templates" / "half-done").mkdir()
    (tmp_path / "s" / "templates" / "Bad.Name").mkdir()
    (tmp_path / "s" / "templates" / "Bad.Name" / "manifest.json").write_text("{}")
    tmp = tmp_path / "s" / "templates" / "half-done" / ".manifest.json.x1.tmp"
    tmp.write_text("{")
    assert store.list_templates() == []
    assert store.sweep_temp_files(older_than_s=0) == 1 and not tmp.exists()


def test_failed_write_leaves_no_visible_file(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "s")
    data = os.urandom(1000)
    digest = hashlib.sha256(data).hexdigest()

    def boom(*a, **k):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        store.put_shard(digest, data)
    monkeypatch.undo()
    assert not store.has_shard(digest)
    assert [p for p in (tmp_path / "s").rglob("*") if p.is_file()] == []  # temp cleaned up too


_CRASHER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[3])  # tests/, for the synthetic template fixtures
    from cloud_server.store import LocalStore
    from synthetic_templates import build_synthetic

    root, point = sys.argv[1], sys.argv[2]
    real_replace = os.replace

    def crash_before_rename(src, dst):
        # the data is written and fsynced to the temp file; the rename that publishes it has not happened
        if point == "shard" or str(dst).endswith("manifest.json"):
            sys.stdout.write("ready\\n")
            sys.stdout.flush()
            time.sleep(60)  # killed here
        real_replace(src, dst)

    os.replace = crash_before_rename
    store = LocalStore(root)
    t = build_synthetic("crashy", model_id="ab" * 32, level_bytes=(1 << 20, 4096))
    for digest, blob in t.blobs.items():
        store.put_shard(digest, blob)
    store.put_manifest("crashy", t.manifest)
    """
)


@pytest.mark.parametrize("point", ["shard", "manifest"])
def test_sigkill_mid_publish_leaves_nothing_visible(tmp_path, point):
    """SIGKILL a writer just before its rename: no partial shard or manifest is ever visible."""
    root = tmp_path / "s"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHER, str(root), point, str(Path(__file__).resolve().parents[1])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = proc.stdout.readline()
        assert line == b"ready\n", proc.stderr.read().decode()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
    store = LocalStore(root)
    t = build_synthetic("crashy", model_id="ab" * 32, level_bytes=(1 << 20, 4096))
    temps = [p for p in root.rglob(".*.tmp")]
    assert temps, "the crash should have left a (hidden) temp file behind"
    assert store.list_templates() == []
    assert not store.has_template("crashy")
    for digest in t.blobs:
        if store.has_shard(digest):  # whatever is visible is complete and correct
            assert hashlib.sha256(store.shard_path(digest).read_bytes()).hexdigest() == digest
    if point == "shard":
        assert not any(store.has_shard(d) for d in t.blobs)
    else:
        assert all(store.has_shard(d) for d in t.blobs)
    assert store.sweep_temp_files(older_than_s=0) == len(temps)
