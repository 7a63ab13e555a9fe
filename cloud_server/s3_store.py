"""The ``Store`` on an S3 object store (AWS S3, Ceph radosgw, MinIO, ...), through boto3.

Keys under ``s3://BUCKET/PREFIX`` are the local store's layout (``sakura_core.fetch.store_layout``), so a bucket and
a folder hold the same names::

    PREFIX/shards/<aa>/<digest>                 immutable shard blob (sha256 hex of the blob = its name)
    PREFIX/templates/<id>/manifest.json         the template's manifest (published last)
    PREFIX/templates/<id>/source.<png|jpg|webp> the template image it was computed from
    PREFIX/quarantine/<digest>.<unix time>      what ``sakura store repair`` moved aside

The guarantees are the local store's, from S3's own: a PUT replaces an object whole (no reader ever sees part of
one; a PUT cut off mid-body leaves the old object), so shards are PUT first and the manifest last, and a reader
sees the old or the new manifest, never a mix. Every PUT carries ``Content-MD5`` (the server refuses a body damaged
in transit). Reads after writes and listings are strongly consistent on AWS S3 and on a single radosgw zone.

Credentials and endpoint come from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles,
instance roles; ``AWS_ENDPOINT_URL``) unless given. Requests use path-style addressing when an endpoint is set
(radosgw/MinIO have no per-bucket DNS names). boto3 clients are thread-safe: one client serves every thread.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from sakura_core.fetch.store_layout import MANIFEST_FILE, TEMPLATES_DIR, shard_key, template_key
from sakura_core.limits import MAX_JSON_BYTES

from .s3_conditional import ObjectExistsError, create_only_manifest
from .s3_io import S3Config, S3ShardReader, error_code, read_bounded, s3_error
from .store import (
    SOURCE_IMAGE_EXTS,
    DigestMismatchError,
    NotFoundError,
    Store,
    StoreError,
    StoreFaultError,
    validate_template_id,
)

__all__ = ["S3Config", "S3Location", "S3ShardReader", "S3Store", "parse_s3_url"]

logger = logging.getLogger(__name__)

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
_NOT_MODIFIED = frozenset({"304", "NotModified"})
#: Refused manifests remembered (by key and ETag) so that a catalog rebuild does not read them again.
_MAX_REMEMBERED_REFUSALS = 4096


class _Unchanged(Exception):
    """A conditional GET found the object unchanged (304)."""


@dataclass(frozen=True)
class S3Location:
    """Where an S3 store lives: ``bucket`` and ``prefix`` (no leading or trailing slash; ``""`` = the bucket root)."""

    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_s3_url(url: str) -> S3Location:
    """``s3://bucket[/prefix]`` -> ``S3Location``; ``ValueError`` naming the rule a bad bucket or prefix breaks."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"not an S3 store URL: {str(url)[:80]!r}; use s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    prefix = prefix.strip("/")
    if _BUCKET_RE.fullmatch(bucket) is None or ".." in bucket:
        raise ValueError(
            f"invalid bucket name {bucket[:80]!r} in {url[:120]!r}: 3-63 characters from a-z, 0-9, '.' and '-', "
            "starting and ending with a letter or digit"
        )
    if prefix and (_PREFIX_RE.fullmatch(prefix) is None or any(p in (".", "..") for p in prefix.split("/"))):
        raise ValueError(
            f"invalid key prefix {prefix[:80]!r} in {url[:120]!r}: '/'-separated names from A-Z, a-z, 0-9, '.', "
            "'_' and '-' (no empty, '.' or '..' parts)"
        )
    return S3Location(bucket, prefix)


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


class S3Store(Store):
    """A store in ``s3://bucket/prefix`` (see the module docstring for the layout and guarantees).

    Args:
        location: an ``s3://bucket/prefix`` URL or an ``S3Location``.
        endpoint_url: the S3 endpoint (e.g. a radosgw's ``http://127.0.0.1:7480``); default ``$AWS_ENDPOINT_URL_S3``
            / ``$AWS_ENDPOINT_URL`` / AWS.
        region: signing region; default ``$AWS_DEFAULT_REGION`` / ``$AWS_REGION`` / ``us-east-1``.
        client: a ready boto3 S3 client (then ``endpoint_url``, ``region`` and ``config`` are not used).
        config: the client's timeouts, retries and connections (``S3Config``; its ``deadline_s`` also bounds a
            whole-object read).
    """

    open_is_fast = False

    def __init__(
        self,
        location: str | S3Location,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client=None,
        config: S3Config | None = None,
    ):
        self.location = location if isinstance(location, S3Location) else parse_s3_url(location)
        self.bucket = self.location.bucket
        self._root = f"{self.location.prefix}/" if self.location.prefix else ""
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.config = config or S3Config()
        self._client = client if client is not None else self._make_client(region)
        from botocore.exceptions import BotoCoreError, ClientError

        self._errors = (BotoCoreError, ClientError)
        self._refused: OrderedDict[str, tuple[str, str]] = OrderedDict()  # key -> (ETag, why), newest last
        self._refused_lock = threading.Lock()
        self.create_only: bool | None = None  # does the server honour If-None-Match on PUT (probed on first use)

    def _make_client(self, region: str | None):
        try:
            import boto3
        except ImportError as e:
            raise StoreError("an s3:// store needs boto3: pip install 'sakura-kv[cloud]' (or boto3)") from e
        region = region or os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        config = self.config.botocore_config(region, self.endpoint_url)
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, config=config)

    @property
    def client(self):
        """The boto3 S3 client (for what this class does not wrap)."""
        return self._client

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Store({str(self.location)!r}{where})"

    # ---- keys (only ever built from validated names) ---------------------------------------------------------
    def shard_key(self, digest: str) -> str:
        return f"{self._root}{shard_key(digest)}"

    def template_key(self, template_id: str, name: str) -> str:
        return f"{self._root}{template_key(template_id, name)}"

    def key(self, relative: str) -> str:
        """The object key of a name relative to the store root (``shards/..``, ``quarantine/..``)."""
        return f"{self._root}{relative}"

    def relative(self, key: str) -> str:
        return key[len(self._root) :]

    # ---- raw object calls (errors mapped to store errors) -----------------------------------------------------
    def _fail(self, what: str, e: Exception) -> StoreError:
        return s3_error(self, what, e)

    def get_object(self, key: str, byte_range: str | None = None, *, if_none_match: str | None = None) -> dict:
        """``GetObject`` (streaming ``Body``, nothing of it read yet); ``NotFoundError`` when the key is absent.
        With ``if_none_match`` (an ETag) ``_Unchanged`` when the object still has it."""
        kwargs = {"Bucket": self.bucket, "Key": key}
        if byte_range is not None:
            kwargs["Range"] = byte_range
        if if_none_match is not None:
            kwargs["IfNoneMatch"] = if_none_match
        try:
            return self._client.get_object(**kwargs)
        except self._errors as e:
            if error_code(e) in _NOT_FOUND:
                raise NotFoundError(f"no object {key} in {self}") from e
            if if_none_match is not None and error_code(e) in _NOT_MODIFIED:
                raise _Unchanged(key) from e
            raise self._fail(f"GET {key}", e) from e

    def head_object(self, key: str) -> dict | None:
        """``HeadObject``'s answer, or ``None`` when the key is absent."""
        try:
            return self._client.head_object(Bucket=self.bucket, Key=key)
        except self._errors as e:
            if error_code(e) in _NOT_FOUND:
                return None
            raise self._fail(f"HEAD {key}", e) from e

    def put_object(
        self, key: str, data: bytes, content_type: str = "application/octet-stream", *, if_none_match: bool = False
    ) -> None:
        """One whole-object PUT with ``Content-MD5`` (never multipart: the object appears whole or not at all).
        ``if_none_match``: create only (``If-None-Match: *``); ``ObjectExistsError`` when the key exists."""
        extra = {"IfNoneMatch": "*"} if if_none_match else {}
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentMD5=_md5_b64(data), ContentType=content_type, **extra
            )
        except self._errors as e:
            if if_none_match and error_code(e) in ("PreconditionFailed", "412"):
                raise ObjectExistsError(f"{key} exists in {self}") from e
            raise self._fail(f"PUT {key}", e) from e

    def delete_object(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except self._errors as e:
            raise self._fail(f"DELETE {key}", e) from e

    def copy_object(self, src_key: str, dest_key: str) -> None:
        try:
            self._client.copy_object(
                Bucket=self.bucket, Key=dest_key, CopySource={"Bucket": self.bucket, "Key": src_key}
            )
        except self._errors as e:
            raise self._fail(f"COPY {src_key} -> {dest_key}", e) from e

    def list_objects(self, relative_prefix: str):
        """Every object under ``PREFIX/relative_prefix``: yields ListObjectsV2 entries (Key, Size, LastModified)."""
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.key(relative_prefix)):
                yield from page.get("Contents", [])
        except self._errors as e:
            raise self._fail(f"LIST {self.key(relative_prefix)}", e) from e

    def list_multipart_uploads(self) -> list[dict]:
        """Unfinished multipart uploads under the prefix (nothing here makes them; another tool's leftovers)."""
        try:
            resp = self._client.list_multipart_uploads(Bucket=self.bucket, Prefix=self._root)
        except self._errors as e:
            raise self._fail("LIST multipart uploads", e) from e
        return resp.get("Uploads", [])

    def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except self._errors as e:
            raise self._fail(f"ABORT upload {upload_id} of {key}", e) from e

    # ---- bucket ---------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ``StoreError`` saying what is wrong unless the bucket exists and these credentials reach it."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except self._errors as e:
            if error_code(e) in _NOT_FOUND:
                raise StoreError(f"{self}: bucket {self.bucket!r} does not exist; create it first") from e
            raise self._fail("HEAD bucket", e) from e

    def create_bucket(self) -> None:
        """Create the bucket if it does not exist (tests, benchmarks and first-time set-up)."""
        try:
            self._client.create_bucket(Bucket=self.bucket)
        except self._errors as e:
            if error_code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._fail("CREATE bucket", e) from e

    # ---- shards ---------------------------------------------------------------------------------------------
    def put_shard(self, digest: str, data: bytes) -> None:
        key = self.shard_key(digest)
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise DigestMismatchError(f"shard bytes hash to {actual}, not to the digest {digest} they were put under")
        head = self.head_object(key)
        if head is not None and head.get("ContentLength") == len(data):
            return  # content-addressed and written whole: the same bytes (``sakura store verify`` re-hashes)
        if head is not None:
            logger.warning(
                "%s: shard %s is %s bytes, not %d (corrupt); rewriting it",
                self,
                digest,
                head.get("ContentLength"),
                len(data),
            )
        self.put_object(key, data)

    def has_shard(self, digest: str) -> bool:
        return self.head_object(self.shard_key(digest)) is not None

    def open_shard(self, digest: str) -> tuple[io.RawIOBase, int]:
        key = self.shard_key(digest)
        try:
            resp = self.get_object(key)
        except NotFoundError as e:
            raise NotFoundError(f"no shard {digest} in {self}") from e
        size = int(resp["ContentLength"])
        return S3ShardReader(self, key, size, resp["Body"]), size

    def read_object(self, key: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
        """An object's bytes, read whole only when it holds at most ``max_bytes`` (``StoreFaultError`` from its
        ``Content-Length`` before its body is read) and within ``config.deadline_s``."""
        return read_bounded(self, f"object {key}", self.get_object(key), max_bytes, self.config.deadline_s)

    def _read_manifest_object(self, key: str, what: str) -> bytes:
        """``read_object`` of a manifest, remembering a refusal by key and ETag: while the object keeps that ETag it
        is refused again from a conditional GET (304, no body) instead of being read."""
        with self._refused_lock:
            refused = self._refused.get(key)
        try:
            resp = self.get_object(key, if_none_match=refused[0] if refused else None)
        except _Unchanged:
            assert refused is not None  # a 304 answers only the conditional GET sent with a refused ETag
            raise StoreFaultError(refused[1]) from None
        try:
            return read_bounded(self, what, resp, MAX_JSON_BYTES, self.config.deadline_s)
        except StoreFaultError as e:
            etag = resp.get("ETag")
            if etag:
                with self._refused_lock:
                    self._refused[key] = (etag, str(e))
                    self._refused.move_to_end(key)
                    while len(self._refused) > _MAX_REMEMBERED_REFUSALS:
                        self._refused.popitem(last=False)
            raise

    # ---- templates ------------------------------------------------------------------------------------------
    def put_manifest(self, template_id: str, manifest: dict) -> None:
        data = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
        self.put_object(self.template_key(template_id, MANIFEST_FILE), data, "application/json")

    def put_new_manifest(self, template_id: str, manifest: dict) -> None:
        """Atomic where the server honours ``If-None-Match: *`` (probed once: :mod:`.s3_conditional`)."""
        create_only_manifest(self, template_id, manifest, fallback=super().put_new_manifest)

    def get_manifest_bytes(self, template_id: str) -> bytes:
        key = self.template_key(template_id, MANIFEST_FILE)
        try:
            return self._read_manifest_object(key, f"manifest of template {template_id!r}")
        except NotFoundError as e:
            raise NotFoundError(f"no published template {template_id!r} in {self}") from e

    def has_template(self, template_id: str) -> bool:
        return self.head_object(self.template_key(template_id, MANIFEST_FILE)) is not None

    def list_templates(self) -> list[str]:
        ids = []
        for obj in self.list_objects(f"{TEMPLATES_DIR}/"):
            parts = self.relative(obj["Key"]).split("/")
            if len(parts) == 3 and parts[2] == MANIFEST_FILE:
                try:
                    ids.append(validate_template_id(parts[1]))
                except ValueError:
                    logger.warning("%s: ignoring %s (not a template id)", self, obj["Key"])
        return sorted(ids)

    def put_source_image(self, template_id: str, data: bytes, ext: str) -> None:
        if ext not in SOURCE_IMAGE_EXTS:
            raise ValueError(f"source image extension {ext!r} not one of {SOURCE_IMAGE_EXTS}")
        ctype = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp"}[ext]
        self.put_object(self.template_key(template_id, f"source.{ext}"), data, ctype)
