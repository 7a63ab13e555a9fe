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
from dataclasses import dataclass
from typing import BinaryIO

from sakura_core.fetch.store_layout import MANIFEST_FILE, TEMPLATES_DIR, shard_key, template_key

from .s3_conditional import ObjectExistsError, create_only_manifest
from .store import (
    SOURCE_IMAGE_EXTS,
    DigestMismatchError,
    NotFoundError,
    Store,
    StoreError,
    validate_template_id,
)

__all__ = ["S3Location", "S3ShardReader", "S3Store", "parse_s3_url"]

logger = logging.getLogger(__name__)

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})


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


def _code(e: Exception) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


class S3ShardReader(io.RawIOBase):
    """A shard object as a seekable binary file: reads stream one GET; a seek elsewhere starts a ranged GET there.

    Opened with the first GET already answered (so a missing shard is known before any response header is sent).
    ``fileno()`` is unsupported: the server streams it in chunks instead of ``sendfile``.
    """

    def __init__(self, store: S3Store, key: str, size: int, body):
        super().__init__()
        self._store, self._key, self.size = store, key, size
        self._body, self._body_pos, self._pos = body, 0, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf) -> int:
        if self._pos >= self.size:
            return 0
        if self._body is None or self._body_pos != self._pos:
            self._close_body()
            resp = self._store.get_object(self._key, byte_range=f"bytes={self._pos}-")
            self._body, self._body_pos = resp["Body"], self._pos
        data = self._body.read(len(buf))
        if not data:
            raise StoreError(f"{self._store}: shard object {self._key} ended at byte {self._pos} of {self.size}")
        n = len(data)
        buf[:n] = data
        self._pos += n
        self._body_pos += n
        return n

    def _close_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._close_body()
        super().close()


class S3Store(Store):
    """A store in ``s3://bucket/prefix`` (see the module docstring for the layout and guarantees).

    Args:
        location: an ``s3://bucket/prefix`` URL or an ``S3Location``.
        endpoint_url: the S3 endpoint (e.g. a radosgw's ``http://127.0.0.1:7480``); default ``$AWS_ENDPOINT_URL_S3``
            / ``$AWS_ENDPOINT_URL`` / AWS.
        region: signing region; default ``$AWS_DEFAULT_REGION`` / ``$AWS_REGION`` / ``us-east-1``.
        client: a ready boto3 S3 client (then ``endpoint_url`` and ``region`` are not used).
        max_connections: HTTP connections the client keeps (threads reading shards at once).
    """

    open_is_fast = False

    def __init__(
        self,
        location: str | S3Location,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client=None,
        max_connections: int = 64,
    ):
        self.location = location if isinstance(location, S3Location) else parse_s3_url(location)
        self.bucket = self.location.bucket
        self._root = f"{self.location.prefix}/" if self.location.prefix else ""
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self._client = client if client is not None else self._make_client(region, max_connections)
        from botocore.exceptions import BotoCoreError, ClientError

        self._errors = (BotoCoreError, ClientError)
        self.create_only: bool | None = None  # does the server honour If-None-Match on PUT (probed on first use)

    def _make_client(self, region: str | None, max_connections: int):
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:
            raise StoreError("an s3:// store needs boto3: pip install 'sakura-kv[cloud]' (or boto3)") from e
        region = region or os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        config = Config(
            region_name=region,
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
            retries={"max_attempts": 4, "mode": "standard"},
            max_pool_connections=max_connections,
            connect_timeout=10,
            read_timeout=120,
            # botocore >= 1.36 adds CRC checksums (aws-chunked bodies) by default, which S3-compatible servers such
            # as Ceph 16's radosgw refuse; Content-MD5 on every PUT checks the body instead.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
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
        code = _code(e)
        if code == "NoSuchBucket":
            return StoreError(
                f"{self}: bucket {self.bucket!r} does not exist; create it first (S3Store.create_bucket)"
            )
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"):
            return StoreError(f"{self}: {what}: {code}; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
        return StoreError(f"{self}: {what} failed: {type(e).__name__}: {str(e)[:300]}")

    def get_object(self, key: str, byte_range: str | None = None) -> dict:
        """``GetObject`` (streaming ``Body``); ``NotFoundError`` when the key is absent."""
        kwargs = {"Bucket": self.bucket, "Key": key}
        if byte_range is not None:
            kwargs["Range"] = byte_range
        try:
            return self._client.get_object(**kwargs)
        except self._errors as e:
            if _code(e) in _NOT_FOUND:
                raise NotFoundError(f"no object {key} in {self}") from e
            raise self._fail(f"GET {key}", e) from e

    def head_object(self, key: str) -> dict | None:
        """``HeadObject``'s answer, or ``None`` when the key is absent."""
        try:
            return self._client.head_object(Bucket=self.bucket, Key=key)
        except self._errors as e:
            if _code(e) in _NOT_FOUND:
                return None
            raise self._fail(f"HEAD {key}", e) from e

    def put_object(self, key: str, data: bytes, content_type: str = "application/octet-stream", *,
                   if_none_match: bool = False) -> None:  # fmt: skip
        """One whole-object PUT with ``Content-MD5`` (never multipart: the object appears whole or not at all).
        ``if_none_match``: create only (``If-None-Match: *``); ``ObjectExistsError`` when the key exists."""
        extra = {"IfNoneMatch": "*"} if if_none_match else {}
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentMD5=_md5_b64(data),
                                    ContentType=content_type, **extra)  # fmt: skip
        except self._errors as e:
            if if_none_match and _code(e) in ("PreconditionFailed", "412"):
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
            if _code(e) in _NOT_FOUND:
                raise StoreError(f"{self}: bucket {self.bucket!r} does not exist; create it first") from e
            raise self._fail("HEAD bucket", e) from e

    def create_bucket(self) -> None:
        """Create the bucket if it does not exist (tests, benchmarks and first-time set-up)."""
        try:
            self._client.create_bucket(Bucket=self.bucket)
        except self._errors as e:
            if _code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
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
            logger.warning("%s: shard %s is %s bytes, not %d (corrupt); rewriting it", self, digest,
                           head.get("ContentLength"), len(data))  # fmt: skip
        self.put_object(key, data)

    def has_shard(self, digest: str) -> bool:
        return self.head_object(self.shard_key(digest)) is not None

    def open_shard(self, digest: str) -> tuple[BinaryIO, int]:
        key = self.shard_key(digest)
        try:
            resp = self.get_object(key)
        except NotFoundError as e:
            raise NotFoundError(f"no shard {digest} in {self}") from e
        size = int(resp["ContentLength"])
        return S3ShardReader(self, key, size, resp["Body"]), size

    def read_object(self, key: str) -> bytes:
        body = self.get_object(key)["Body"]
        try:
            return body.read()
        except self._errors as e:
            raise self._fail(f"GET {key}", e) from e
        finally:
            body.close()

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
            return self.read_object(key)
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
