"""How an :class:`~cloud_server.s3_store.S3Store` talks to S3: its client's timeouts and retries (``S3Config``), S3
errors mapped once to store errors, whole-object reads bounded before and while they are read, and shards streamed.

Every request has a deadline: ``max_attempts`` tries of at most ``connect_timeout_s`` + ``read_timeout_s`` each (the
read timeout bounds each wait for bytes, the response's head included) plus botocore's backoff between tries
(``S3Config.deadline_s``); a whole-object read (a manifest) must also end within that deadline, however slowly its
body trickles in. S3 errors become:

* :class:`~cloud_server.store.StoreUnavailableError` (retrying may help): the endpoint cannot be reached, a
  timeout, a connection cut mid-body, a 5xx or throttling answer;
* :class:`~cloud_server.store.StoreRefusedError` (retrying does not help): 403 (credentials), a missing bucket;
* :class:`~cloud_server.store.StoreFaultError`: an object over its size limit (refused from its ``Content-Length``
  before any byte of its body is read), a body longer or shorter than it declared;
* ``StoreError`` for any other answer.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass

from .store import StoreError, StoreFaultError, StoreRefusedError, StoreUnavailableError

__all__ = ["S3Config", "S3ShardReader", "error_code", "read_bounded", "s3_error", "stream_errors"]

logger = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 1 << 20
_CREDENTIAL_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"})
_BUSY_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"})
#: botocore's standard retry mode waits at most 2**(n-1) s before try n+1 (throttling), plus up to 5 s more when the
#: server sends ``x-amz-retry-after``.
_RETRY_AFTER_CAP_S = 5.0


@dataclass(frozen=True)
class S3Config:
    """Timeouts, retries and connections of an ``S3Store``'s client.

    Attributes:
        connect_timeout_s: seconds to open a TCP connection to the endpoint.
        read_timeout_s: seconds one wait for bytes may last (the response's head, or the next part of a body).
        max_attempts: tries of one request, the first included (botocore's standard mode retries timeouts,
            connection errors, 5xx and throttling).
        max_connections: HTTP connections the client keeps (threads reading at once).
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_attempts: int = 2
    max_connections: int = 64

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not 0 < value <= 600:
                raise ValueError(f"S3Config.{name} must be in (0, 600] seconds, got {value}")
        if not 1 <= self.max_attempts <= 10:
            raise ValueError(f"S3Config.max_attempts must be in 1..10 (1 = no retry), got {self.max_attempts}")
        if self.max_connections < 1:
            raise ValueError(f"S3Config.max_connections must be >= 1, got {self.max_connections}")

    @property
    def deadline_s(self) -> float:
        """The longest one request (or one whole-object read) may take: every try's timeouts plus the waits between
        tries."""
        waits_s = sum(min(2.0 ** (i - 1), 20.0) + _RETRY_AFTER_CAP_S for i in range(1, self.max_attempts))
        return self.max_attempts * (self.connect_timeout_s + self.read_timeout_s) + waits_s

    def botocore_config(self, region: str, endpoint_url: str | None):
        from botocore.config import Config

        return Config(
            region_name=region,
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            retries={"total_max_attempts": self.max_attempts, "mode": "standard"},  # the first try included
            max_pool_connections=self.max_connections,
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            # botocore >= 1.36 adds CRC checksums (aws-chunked bodies) by default, which S3-compatible servers such
            # as Ceph 16's radosgw refuse; Content-MD5 on every PUT checks the body instead.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )


def error_code(e: Exception) -> str:
    """The S3 error code of a botocore ``ClientError`` (``""`` for other errors)."""
    return str((getattr(e, "response", None) or {}).get("Error", {}).get("Code", ""))


def _http_status(e: Exception) -> int:
    return int((getattr(e, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def s3_error(store: object, what: str, e: Exception) -> StoreError:
    """The store error of an S3 error ``e`` met doing ``what`` (see the module docstring); its message names the
    store and its ``kind`` the fault (one log line per kind)."""
    from botocore import exceptions as bx

    code, status = error_code(e), _http_status(e)
    if code == "NoSuchBucket":
        return StoreRefusedError(
            f"{store}: bucket does not exist; create it first (S3Store.create_bucket)", kind="S3 bucket missing"
        )
    if code in _CREDENTIAL_CODES or status == 403:
        return StoreRefusedError(
            f"{store}: {what}: {code or status}; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
            kind="S3 access denied",
        )
    detail = f"{type(e).__name__}: {str(e)[:300]}"
    if isinstance(e, (bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        return StoreUnavailableError(f"{store}: {what} timed out: {detail}", kind="S3 timeout")
    if isinstance(e, bx.EndpointConnectionError):
        return StoreUnavailableError(
            f"{store}: {what}: the endpoint cannot be reached: {detail}", kind="S3 endpoint unreachable"
        )
    if isinstance(e, (bx.ConnectionError, bx.ResponseStreamingError, bx.IncompleteReadError, OSError)):
        return StoreUnavailableError(
            f"{store}: {what}: the connection to S3 broke: {detail}", kind="S3 connection broken"
        )
    if status >= 500 or code in _BUSY_CODES:
        return StoreUnavailableError(f"{store}: {what}: S3 answered {status} {code}", kind="S3 server error")
    return StoreError(f"{store}: {what} failed: {detail}")


def stream_errors() -> tuple[type[Exception], ...]:
    """What reading a botocore body can raise besides its own errors (urllib3's, socket errors)."""
    from botocore.exceptions import BotoCoreError, ClientError
    from urllib3.exceptions import HTTPError

    return BotoCoreError, ClientError, HTTPError, OSError


def read_bounded(store: object, what: str, resp: dict, max_bytes: int, deadline_s: float) -> bytes:
    """The body of a ``GetObject`` answer ``resp``, read only when its ``Content-Length`` is at most ``max_bytes``
    (else ``StoreFaultError`` before reading a byte); reading stops at the declared length (or at ``max_bytes`` + 1
    without one) and must end within ``deadline_s``. The body is closed either way."""
    body, declared = resp["Body"], resp.get("ContentLength")
    try:
        if declared is not None and int(declared) > max_bytes:
            raise StoreFaultError(f"{store}: {what} is {int(declared)} bytes, over the limit of {max_bytes}")
        cap = max_bytes + 1 if declared is None else int(declared)
        end_s = time.monotonic() + deadline_s
        parts, got = [], 0
        while got < cap:
            try:
                chunk = body.read(min(_READ_CHUNK_BYTES, cap - got))
            except stream_errors() as e:
                raise s3_error(store, f"reading {what}", e) from e
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
            if time.monotonic() > end_s:
                raise StoreUnavailableError(
                    f"{store}: {what}: the body took longer than {deadline_s:g} s", kind="S3 timeout"
                )
        if got > max_bytes:
            raise StoreFaultError(f"{store}: {what} is over the limit of {max_bytes} bytes (no Content-Length)")
        if declared is not None and got != int(declared):
            raise StoreUnavailableError(
                f"{store}: {what} ended at byte {got} of {declared}", kind="S3 connection broken"
            )
        return b"".join(parts)
    finally:
        body.close()


class S3ShardReader(io.RawIOBase):
    """A shard object as a seekable binary file: reads stream one GET; a seek elsewhere starts a ranged GET there.

    Opened with the first GET already answered (so a missing shard is known before any response header is sent).
    ``fileno()`` is unsupported: the server streams it in chunks instead of ``sendfile``. A read that fails (a
    timeout, a connection cut, a body shorter than declared) raises a store error naming the shard.
    """

    def __init__(self, store, key: str, size: int, body):
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
        try:
            data = self._body.read(min(len(buf), self.size - self._pos))
        except stream_errors() as e:
            self._close_body()
            raise s3_error(self._store, f"reading shard object {self._key} at byte {self._pos}", e) from e
        if not data:
            self._close_body()
            raise StoreUnavailableError(
                f"{self._store}: shard object {self._key} ended at byte {self._pos} of {self.size}",
                kind="S3 connection broken",
            )
        n = len(data)
        buf[:n] = data
        self._pos += n
        self._body_pos += n
        return n

    def _close_body(self) -> None:
        if self._body is not None:
            body, self._body = self._body, None
            try:
                body.close()
            except stream_errors() as e:  # closing a broken connection: the read already said what broke
                logger.debug("%s: closing %s: %r", self._store, self._key, e)

    def close(self) -> None:
        self._close_body()
        super().close()
