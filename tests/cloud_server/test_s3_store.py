"""``S3Store`` and ``sakura store verify|repair`` on a real radosgw: names and errors, listing only published
templates, Range reads, and the fsck findings and repairs of the local store, on objects."""

import hashlib
import os

import pytest

from cloud_server.fsck import FsckConfig
from cloud_server.s3_fsck import fsck_s3
from cloud_server.s3_store import parse_s3_url
from cloud_server.store import DigestMismatchError, InvalidNameError, NotFoundError, StoreError
from cloud_server.store_url import open_store
from sakura_core.cli import main

from ..synthetic_templates import build_synthetic, make_synthetic_template
from .conftest import MODEL_ID, new_s3_store


@pytest.fixture
def s3(radosgw):
    return new_s3_store(radosgw, "unit")


@pytest.mark.parametrize(
    "url, message",
    [
        ("s3://A_b/x", "invalid bucket"),
        ("s3://ab/x", "invalid bucket"),
        ("s3://bucket/../x", "invalid key prefix"),
        ("s3://bucket/a//b", "invalid key prefix"),
        ("gs://bucket/x", "not an S3 store URL"),
    ],
)
def test_bad_urls_name_the_rule(url, message):
    with pytest.raises(ValueError, match=message):
        parse_s3_url(url)


def test_store_urls_and_schemes(tmp_path):
    assert parse_s3_url("s3://my-bucket/a/b/").prefix == "a/b"
    with pytest.raises(ValueError, match="unsupported scheme 'gs'"):
        open_store("gs://bucket/x")
    with pytest.raises(ValueError, match="only for s3://"):
        open_store(tmp_path, endpoint_url="http://127.0.0.1:1")


def test_names_are_validated_before_any_request(s3):
    with pytest.raises(InvalidNameError):
        s3.open_shard("../" + "a" * 61)
    with pytest.raises(InvalidNameError):
        s3.get_manifest_bytes("../etc")
    with pytest.raises(DigestMismatchError):
        s3.put_shard("0" * 64, b"data")
    with pytest.raises(NotFoundError):
        s3.get_manifest_bytes("nope")


def test_only_templates_with_a_manifest_are_listed(s3):
    make_synthetic_template(s3, "tpl-a", model_id=MODEL_ID)
    s3.put_source_image("half-done", b"png", "png")  # a publish that never reached its manifest
    s3.put_object(s3.key("templates/Bad_Id/manifest.json"), b"{}")
    assert s3.list_templates() == ["tpl-a"]
    assert s3.has_template("tpl-a") and not s3.has_template("half-done")


def test_range_reads_and_a_rewritten_short_object(s3):
    blob = os.urandom(300_000)
    digest = hashlib.sha256(blob).hexdigest()
    s3.put_shard(digest, blob)
    f, size = s3.open_shard(digest)
    with f:
        assert size == len(blob) and f.read(10) == blob[:10]
        f.seek(123_456)
        assert f.read(1000) == blob[123_456:124_456]
        f.seek(0)
        assert f.read() == blob
    s3.put_object(s3.shard_key(digest), blob[:100])  # truncated by someone: a different size
    s3.put_shard(digest, blob)  # republishing rewrites it
    assert s3.read_object(s3.shard_key(digest)) == blob


def test_a_missing_bucket_and_bad_credentials_say_so(radosgw, monkeypatch):
    from cloud_server.s3_store import S3Store

    with pytest.raises(StoreError, match="does not exist"):
        S3Store("s3://no-such-bucket-here", endpoint_url=radosgw.endpoint_url).check()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(StoreError, match="AWS_SECRET_ACCESS_KEY"):
        S3Store("s3://sakura-tests", endpoint_url=radosgw.endpoint_url).check()


def _damaged(s3):
    manifest = make_synthetic_template(s3, "tpl-a", model_id=MODEL_ID)
    reps = [r for s in manifest["shards"] for r in s["representations"]]
    corrupt, missing = reps[0]["digest"], reps[1]["digest"]
    blob = s3.read_object(s3.shard_key(corrupt))
    s3.put_object(s3.shard_key(corrupt), bytes([blob[0] ^ 0xFF]) + blob[1:])  # same size, wrong bytes
    s3.delete_object(s3.shard_key(missing))
    orphan = build_synthetic("tpl-b", model_id=MODEL_ID, seed=9)
    orphan_digest, orphan_blob = next(iter(orphan.blobs.items()))
    s3.put_shard(orphan_digest, orphan_blob)
    s3.put_object(s3.key("shards/zz/notes.txt"), b"not a shard")
    s3.put_object(s3.key("templates/tpl-bad/manifest.json"), b"{not json")
    upload = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=s3.key("shards/ab/unfinished"))
    return corrupt, missing, orphan_digest, upload["UploadId"]


def test_verify_reports_and_repair_fixes_on_objects(s3):
    corrupt, missing, orphan, upload_id = _damaged(s3)
    young = fsck_s3(s3)  # grace periods: the orphan and the upload are too young to be called stale
    assert young.orphans == [] and young.temp_files == []
    report = fsck_s3(s3, FsckConfig(orphan_age_s=0, temp_age_s=0))
    assert report.corrupt == [corrupt] and report.missing == {"tpl-a": [missing]}
    assert report.orphans == [orphan] and report.misplaced == ["shards/zz/notes.txt"]
    assert report.temp_files == [f"upload:shards/ab/unfinished:{upload_id}"]
    assert set(report.bad_manifests) == {"tpl-bad"} and not report.clean
    repaired = fsck_s3(s3, FsckConfig(repair=True, orphan_age_s=0, temp_age_s=0))
    assert len(repaired.quarantined) == 2 and all(q.startswith("quarantine/") for q in repaired.quarantined)
    assert not s3.has_shard(corrupt) and not s3.has_shard(orphan)
    assert s3.list_multipart_uploads() == []
    again = fsck_s3(s3, FsckConfig(orphan_age_s=0, temp_age_s=0))
    assert again.corrupt == again.orphans == again.misplaced == again.temp_files == []
    assert again.missing == {"tpl-a": sorted([corrupt, missing])}  # republishing restores them
    quarantined = [o["Key"] for o in s3.list_objects("quarantine/")]
    assert len(quarantined) == 2


def test_cli_verify_an_s3_store(s3, radosgw, capsys):
    make_synthetic_template(s3, "tpl-a", model_id=MODEL_ID)
    args = ["--store", str(s3.location), "--s3-endpoint", radosgw.endpoint_url]
    assert main(["store", "verify", *args]) == 0 and capsys.readouterr().out.strip().endswith("clean")
    assert main(["store", "verify", "--store", "s3://no-such-bucket-here", "--s3-endpoint", radosgw.endpoint_url]) == 2
    assert "does not exist" in capsys.readouterr().err
