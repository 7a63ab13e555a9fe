"""``ServerConfig``: every knob of the cloud server, validated once."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sakura_core.kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES

__all__ = ["MODELS", "ServerConfig", "check_origin"]

# Served models by name. ``None`` (CLI: ``--model none``) serves the templates of any model read-only.
MODELS = ("demo",)


def check_origin(origin: str) -> str:
    """``origin`` as a browser sends it (``scheme://host[:port]``, no path); ValueError naming it and the fix."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(
            f"allowed origin {origin!r} must be scheme://host[:port] with no path, e.g. "
            "http://localhost:8188 (the ComfyUI the phone page is served by)"
        )
    return f"{parts.scheme}://{parts.netloc}".lower()


@dataclass(frozen=True)
class ServerConfig:
    """Configuration of ``create_app`` / ``sakura serve``.

    Attributes:
        store_dir: folder of the ``LocalStore`` (created if missing); or give ``store_url``.
        store_url: an object store instead of a folder: ``s3://bucket/prefix`` (an ``S3Store``); exactly one of
            ``store_dir`` and ``store_url``.
        s3_endpoint: the S3 endpoint URL of ``store_url`` (default: ``$AWS_ENDPOINT_URL``, else AWS).
        s3_connect_timeout_s, s3_read_timeout_s, s3_max_attempts: an S3 store's per-request limits: seconds to
            connect, seconds one wait for bytes may last, tries of a request (the first included); one request takes
            at most ``s3_max_attempts * (connect + read)`` plus botocore's backoff (``S3Config.deadline_s``).
        store_threads: threads the server reads its store on (its own pool, not asyncio's default executor).
        store_threads_per_object: of those, the most that reads of one object (shard, manifest, the catalog) hold
            at once, so a stalled object delays only its own requests.
        device, dtype: where and in which precision the write path's precompute jobs run the model (``cpu`` /
            ``cuda`` / ``cuda:N``; ``float32`` / ``bfloat16`` / ``float16``, ``None`` = the checkpoint's own).
        host: address to bind; loopback by default. Use a public address only behind TLS and a token.
        port: TCP port; 0 picks a free one (the CLI prints it).
        write_token: bearer token the write path (``POST /v1/templates``, ``GET /v1/jobs/*``) requires.
            ``None`` disables the write path (403).
        read_token: when set, read endpoints (catalog, manifests, shards, metrics) require it too (or the write
            token). ``/healthz`` stays open.
        model: name of the served model (one of ``MODELS``), a diffusers FLUX.2 [klein] pipeline folder's path, or
            ``None``. The served model's id is checked against
            every manifest (a template made for another model is refused with 409) and is the model the write path
            precomputes with. ``None`` serves templates of any model and disables precompute.
        max_upload_bytes: largest template image accepted by ``POST /v1/templates`` (bytes); larger gets 413.
        max_image_pixels: largest decoded template image (width * height pixels); guards against decompression bombs.
        max_header_bytes: longest request line / header field accepted (bytes); longer gets 400/431.
        max_headers: most header fields per request.
        max_pending_jobs: precompute jobs queued or running at once; more gets 429.
        codec: codec name passed to ``precompute_template``.
        shard_layers: consecutive layers per shard passed to ``precompute_template``.
        precompute_seed: seed passed to ``precompute_template`` (importance probes).
        store_profile: what an uploaded template keeps in the store: ``serving`` (the rungs a client fetches, no
            fp16) or ``full`` (every representation, the fp16 included); ``sakura serve --store-profile``.
        catalog_ttl_s: seconds a built catalog is reused before the store is listed again.
        backlog: listen backlog (connections waiting for accept); raise it for thousands of concurrent clients.
        shutdown_timeout_s: seconds in-flight requests get to finish on SIGTERM/SIGINT before they are dropped.
        send_chunk_bytes: read size when a shard must be streamed instead of sent with sendfile (non-file stores).
        idle_timeout_s: seconds a connection may stay idle (no request, or a request's head not yet complete)
            before it is closed: aiohttp's keep-alive timeout, armed when a connection opens (header timeout too).
        max_connections: open connections at most (``sakura serve`` lowers it below the file-descriptor limit);
            more are closed as they arrive.
        refusal_log_interval_s: one log line per kind of refused connection (and for wrong tokens) per this many
            seconds.
        max_token_failures, token_failure_window_s: wrong bearer tokens one client address may send per window (in
            seconds) before it is answered 429 with ``Retry-After`` instead of 401; a right token is never limited.
        phone_model_dir: the phone page's model files (``sakura export --target web``), served at ``/phone/model/``.
        allowed_origins: origins (``scheme://host[:port]``) whose pages may read templates, shards and the phone
            model across origins (``cloud_server/cors.py``): the ComfyUI that serves a dispatch page. Default none.
    """

    store_dir: Path | None = None
    store_url: str | None = None
    s3_endpoint: str | None = None
    s3_connect_timeout_s: float = 5.0
    s3_read_timeout_s: float = 10.0
    s3_max_attempts: int = 2
    store_threads: int = 32
    store_threads_per_object: int = 4
    host: str = "127.0.0.1"
    port: int = 8080
    write_token: str | None = None
    read_token: str | None = None
    model: str | None = "demo"
    max_upload_bytes: int = 16 * 2**20
    max_image_pixels: int = 40_000_000
    max_header_bytes: int = 8190
    max_headers: int = 64
    max_pending_jobs: int = 4
    codec: str = "sakura"
    shard_layers: int = 1
    precompute_seed: int = 0
    store_profile: str = DEFAULT_STORE_PROFILE
    catalog_ttl_s: float = 2.0
    backlog: int = 2048
    shutdown_timeout_s: float = 10.0
    send_chunk_bytes: int = 256 * 2**10
    device: str = "cpu"
    dtype: str | None = None
    idle_timeout_s: float = 15.0
    max_connections: int = 4096
    refusal_log_interval_s: float = 10.0
    max_token_failures: int = 20
    token_failure_window_s: float = 60.0
    phone_model_dir: Path | None = None
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_origins", tuple(check_origin(o) for o in self.allowed_origins))
        if (self.store_dir is None) == (self.store_url is None):
            raise ValueError("give exactly one of store_dir (a folder) and store_url (s3://bucket/prefix)")
        if self.store_dir is not None:
            object.__setattr__(self, "store_dir", Path(self.store_dir))
        elif self.store_url is not None:  # exactly one of the two (checked above)
            from .s3_store import parse_s3_url

            parse_s3_url(self.store_url)
        if self.s3_endpoint is not None and self.store_url is None:
            raise ValueError("s3_endpoint is only for an s3:// store_url")
        self._check_store_io()
        from sakura_core.models.loading import check_device_dtype

        check_device_dtype(self.device, self.dtype)
        try:
            ipaddress.ip_address(self.host)
        except ValueError as e:
            raise ValueError(f"host must be an IP address such as 127.0.0.1, got {self.host!r}") from e
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 = any free port), got {self.port}")
        for name in ("write_token", "read_token"):
            token = getattr(self, name)
            if token is not None and (len(token) < 8 or not token.isprintable() or " " in token):
                raise ValueError(f"{name} must be at least 8 printable characters without spaces, got {len(token)}")
        if self.model is not None:
            from sakura_core.models.loading import check_model_source

            check_model_source(self.model)
        positive = ("max_upload_bytes", "max_image_pixels", "max_header_bytes", "max_headers", "max_pending_jobs")
        for name in (
            *positive,
            "shard_layers",
            "backlog",
            "send_chunk_bytes",
            "max_connections",
            "max_token_failures",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"max_header_bytes must be >= 1024 (requests need room), got {self.max_header_bytes}")
        if self.catalog_ttl_s < 0 or self.shutdown_timeout_s < 0:
            raise ValueError(
                f"catalog_ttl_s and shutdown_timeout_s must be >= 0, got {self.catalog_ttl_s}, {self.shutdown_timeout_s}"
            )
        if not 0 < self.idle_timeout_s <= 3600 or self.refusal_log_interval_s < 0:
            raise ValueError(
                f"idle_timeout_s must be in (0, 3600] and refusal_log_interval_s >= 0, got "
                f"{self.idle_timeout_s}, {self.refusal_log_interval_s}"
            )
        if not self.token_failure_window_s > 0:
            raise ValueError(f"token_failure_window_s must be > 0 seconds, got {self.token_failure_window_s}")
        if not self.codec:
            raise ValueError("codec must be a codec name such as 'sakura'")
        if self.store_profile not in STORE_PROFILES:
            raise ValueError(f"store_profile must be one of {', '.join(STORE_PROFILES)}, got {self.store_profile!r}")

    def _check_store_io(self) -> None:
        for name in ("s3_connect_timeout_s", "s3_read_timeout_s"):
            if not 0 < getattr(self, name) <= 600:
                raise ValueError(f"{name} must be in (0, 600] seconds, got {getattr(self, name)}")
        if not 1 <= self.s3_max_attempts <= 10:
            raise ValueError(f"s3_max_attempts must be in 1..10 (1 = no retry), got {self.s3_max_attempts}")
        if self.store_threads < 1 or not 1 <= self.store_threads_per_object <= self.store_threads:
            raise ValueError(
                f"store_threads must be >= 1 and store_threads_per_object in 1..store_threads, got "
                f"{self.store_threads}, {self.store_threads_per_object}"
            )

    @property
    def s3_config(self):
        """The ``S3Config`` of an S3 store's client (its timeouts and retries)."""
        from .s3_io import S3Config

        return S3Config(self.s3_connect_timeout_s, self.s3_read_timeout_s, self.s3_max_attempts)

    @property
    def store_label(self) -> str:
        """The store as the user named it: its folder or its URL."""
        if self.store_dir is not None:
            return str(self.store_dir)
        assert self.store_url is not None  # exactly one of the two (__post_init__)
        return self.store_url

    def open_store(self):
        """The ``Store`` this config names (a ``LocalStore`` or an ``S3Store``)."""
        from .store_url import open_store

        if self.store_url is None:
            return open_store(self.store_dir)
        return open_store(self.store_url, endpoint_url=self.s3_endpoint, s3_config=self.s3_config)

    @property
    def write_enabled(self) -> bool:
        return self.write_token is not None
