"""Configuration (timeouts, retries, limits) and lifetime counters of the shard client."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClientConfig", "FetchStats"]


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts, retries and limits of ``ShardClient``.

    Attributes:
        connect_timeout_s: seconds to open a connection.
        read_timeout_s: longest silence (seconds) between two reads of a body before the attempt is abandoned.
        max_retries: consecutive failed attempts that brought no new bytes before giving up (once ``retry_window_s``
            has passed too).
        retry_window_s: seconds of backoff a run of failures must span before the client gives up: a server restart
            takes seconds, and resuming beats recomputing on the device. 0 = give up after ``max_retries``.
        max_attempts: attempts per shard in all (each resume is an attempt).
        backoff_initial_s: wait before the first retry (seconds); doubles per consecutive failure.
        backoff_max_s: cap of the wait between retries (seconds).
        backoff_jitter: fraction (0..1) of each wait that is randomised, so clients do not retry in lockstep.
        integrity_retries: full refetches after the assembled bytes fail their digest, before raising.
        chunk_bytes: largest chunk handed to ``throttle``/``on_chunk`` (bytes).
        max_shard_bytes: refuse shards larger than this (bytes).
        max_json_bytes: refuse catalog/manifest bodies larger than this (bytes).
        max_connections: connection pool size of the client's own session.
        seed: seed of the backoff jitter.
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_retries: int = 4
    retry_window_s: float = 8.0
    max_attempts: int = 16
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    backoff_jitter: float = 0.2
    integrity_retries: int = 1
    chunk_bytes: int = 64 * 2**10
    max_shard_bytes: int = 4 * 2**30
    max_json_bytes: int = 16 * 2**20
    max_connections: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.retry_window_s < 0:
            raise ValueError(f"retry_window_s must be >= 0 seconds (0 = max_retries only), got {self.retry_window_s}")
        if self.backoff_initial_s < 0 or not 0 <= self.backoff_jitter <= 1:
            raise ValueError(
                f"backoff_initial_s must be >= 0 and backoff_jitter in [0, 1], got {self.backoff_initial_s}, "
                f"{self.backoff_jitter}"
            )
        for name in ("max_retries", "integrity_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_attempts", "chunk_bytes", "max_shard_bytes", "max_json_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class FetchStats:
    """Counters over the client's lifetime (bytes are payload bytes received, including discarded ones)."""

    shards: int = 0
    bytes_received: int = 0
    attempts: int = 0
    resumes: int = 0
    restarts: int = 0
    integrity_failures: int = 0
    errors: dict[str, int] = field(default_factory=dict)
