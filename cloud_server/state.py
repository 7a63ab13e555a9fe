"""Per-app state of the cloud server: request metrics, precompute jobs, the store and the catalog cache."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sakura_core.http_serving import TokenThrottle

from .catalog_index import CatalogConfig, CatalogIndex
from .compressed_files import CompressedFiles
from .config import ServerConfig
from .conn_guard import IntervalLog
from .precompute import PrecomputeFn
from .store import Store
from .store_io import StoreIO

__all__ = ["CONFIG_KEY", "STATE_KEY", "Job", "Metrics", "ServerState"]

logger = logging.getLogger(__name__)


# ---- state ----------------------------------------------------------------------------------------------------
@dataclass
class Metrics:
    """Counters behind ``GET /metrics``; ``bytes_sent`` counts response bodies (shards, manifests, catalogs)."""

    started_s: float = field(default_factory=time.monotonic)
    requests: dict[str, int] = field(default_factory=dict)
    responses: dict[str, int] = field(default_factory=dict)
    bytes_sent: int = 0
    errors: int = 0
    client_errors: int = 0
    aborted: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def render(self, jobs: dict[str, int]) -> str:
        lines = [
            "# HELP sakura_requests_total Requests received, by route.",
            "# TYPE sakura_requests_total counter",
            *(f'sakura_requests_total{{route="{k}"}} {v}' for k, v in sorted(self.requests.items())),
            "# HELP sakura_responses_total Responses sent, by status class.",
            "# TYPE sakura_responses_total counter",
            *(f'sakura_responses_total{{code="{k}"}} {v}' for k, v in sorted(self.responses.items())),
            "# HELP sakura_bytes_sent_total Response body bytes sent.",
            "# TYPE sakura_bytes_sent_total counter",
            f"sakura_bytes_sent_total {self.bytes_sent}",
            "# HELP sakura_errors_total Server errors (5xx and unhandled exceptions).",
            "# TYPE sakura_errors_total counter",
            f"sakura_errors_total {self.errors}",
            "# HELP sakura_client_errors_total Requests refused with a 4xx status.",
            "# TYPE sakura_client_errors_total counter",
            f"sakura_client_errors_total {self.client_errors}",
            "# HELP sakura_aborted_total Responses cut short because the client went away.",
            "# TYPE sakura_aborted_total counter",
            f"sakura_aborted_total {self.aborted}",
            "# HELP sakura_in_flight Requests being handled now.",
            "# TYPE sakura_in_flight gauge",
            f"sakura_in_flight {self.in_flight}",
            "# HELP sakura_max_in_flight Most requests handled at once since start.",
            "# TYPE sakura_max_in_flight gauge",
            f"sakura_max_in_flight {self.max_in_flight}",
            "# HELP sakura_jobs Precompute jobs, by state.",
            "# TYPE sakura_jobs gauge",
            *(f'sakura_jobs{{state="{k}"}} {v}' for k, v in sorted(jobs.items())),
            "# HELP sakura_uptime_seconds Seconds since the app started.",
            "# TYPE sakura_uptime_seconds gauge",
            f"sakura_uptime_seconds {time.monotonic() - self.started_s:.3f}",
        ]
        return "\n".join(lines) + "\n"


@dataclass
class Job:
    """A precompute job; ``stage``/``done``/``total`` follow the codec's progress callback."""

    job_id: str
    template_id: str
    state: str = "queued"  # queued | running | done | failed
    stage: str = ""
    done: int = 0
    total: int = 0
    error: str | None = None
    shards: int = 0
    shard_bytes: int = 0
    created_s: float = field(default_factory=time.time)
    finished_s: float | None = None

    def to_json(self) -> dict:
        return {
            "job_id": self.job_id,
            "template_id": self.template_id,
            "state": self.state,
            "progress": {"stage": self.stage, "done": self.done, "total": self.total},
            "error": self.error,
            "shards": self.shards,
            "shard_bytes": self.shard_bytes,
            "manifest_url": f"/v1/templates/{self.template_id}/manifest" if self.state == "done" else None,
        }


class _Cancelled(Exception):
    """Raised inside a precompute job's progress callback when the server shuts down."""


class ServerState:
    """Everything one app instance owns (no module globals): store, model, jobs, metrics, caches."""

    def __init__(self, config: ServerConfig, store: Store, model: Any | None, precompute_fn: PrecomputeFn | None):
        self.config = config
        self.store = store
        self.model = model
        self.precompute_fn = precompute_fn
        self.metrics = Metrics()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.job_tasks: set[asyncio.Task] = set()
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.stopping = threading.Event()
        self.catalog_index = CatalogIndex(store, CatalogConfig(ttl_s=config.catalog_ttl_s))
        self.token_throttle = TokenThrottle(
            config.max_token_failures, config.token_failure_window_s, log_interval_s=config.refusal_log_interval_s
        )
        #: why the store cannot be written (``Store.write_problem``, asked at startup), or None
        self.store_write_problem: str | None = None
        #: store reads off the event loop: their own bounded pool, a few threads per object at most
        self.store_io = StoreIO(config.store_threads, config.store_threads_per_object)
        #: store faults answered: one log line per kind per interval
        self.fault_log = IntervalLog(logger, "store fault: ", config.refusal_log_interval_s)
        #: the phone page's WASM, gzip-compressed once per file (cloud_server/phone_page.py)
        self.phone_files = CompressedFiles()

    @property
    def write_off_reason(self) -> str | None:
        """Why the write path is off (no write token, a store that cannot be written), or None when it is on."""
        if self.config.write_token is None:
            return "no --token"
        return self.store_write_problem

    @property
    def model_id(self) -> str | None:
        return None if self.model is None else self.model.model_id

    def invalidate_catalog(self) -> None:
        self.catalog_index.invalidate()

    def job_counts(self) -> dict[str, int]:
        counts = {"queued": 0, "running": 0, "done": 0, "failed": 0}
        for job in self.jobs.values():
            counts[job.state] = counts.get(job.state, 0) + 1
        return counts

    async def catalog(self, after: str | None = None, limit: int | None = None) -> tuple[bytes, str]:
        """(JSON body, ETag) of the whole catalog, or with ``limit`` of one page (:mod:`.catalog_index`); the store
        is listed again at most every ``catalog_ttl_s``, and only changed manifests are read."""
        snap = await self.catalog_index.snapshot(self.model_id)
        if limit is None:
            return snap.body, snap.etag
        return snap.page(after, limit)


CONFIG_KEY = web.AppKey("config", ServerConfig)
STATE_KEY = web.AppKey("state", ServerState)
