"""Running catalog entries: the worker function (one entry -> one published template) and a local process pool.

:func:`run_entry` is what every worker runs, a Ray task (:mod:`.catalog_ray`) or a pool process
(:class:`LocalRunner`): it skips an entry whose key is already published, else precomputes it and publishes it
through :func:`~cloud_server.precompute.publish_template` (shards first, the manifest last, so a worker killed
anywhere leaves the old manifest or none, and a retry redoes the whole entry). Shards are content-addressed, so a
retried or repeated entry rewrites nothing that is already stored.

Requests for one entry are coalesced: entries with the same key run once and every requester gets that result
(``LocalRunner`` within its run; the Ray coordinator across every driver on the cluster).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import multiprocessing
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool

from .catalog import CatalogEntry, published_key
from .precompute import publish_template, read_template_image
from .s3_io import S3Config
from .store_url import open_store

__all__ = ["LocalRunner", "Progress", "make_job", "run_entry"]

logger = logging.getLogger(__name__)

#: ``progress(result)`` after each entry finishes (the result dicts of :func:`run_entry`, or ``status: failed``).
Progress = Callable[[dict], None]


def make_job(
    entry: CatalogEntry, store: str, s3_endpoint: str | None, device: str, dtype: str | None, *, s3_config=None
) -> dict:
    """What a worker needs for ``entry``: plain JSON (the store by URL: workers open their own connection)."""
    limits = None if s3_config is None else dataclasses.asdict(s3_config)  # plain data: a job crosses processes
    return {
        "entry": entry.to_json(),
        "store": store,
        "s3_endpoint": s3_endpoint,
        "device": device,
        "dtype": dtype,
        "s3_config": limits,
    }


@functools.lru_cache(maxsize=2)
def _model(source: str, device: str, dtype: str | None):
    """The model, loaded once per worker process (a worker runs many entries of one model)."""
    from .precompute import load_model

    return load_model(source, device=device, dtype=dtype)


def run_entry(job: dict) -> dict:
    """Precompute and publish one catalog entry (see the module docstring); a result dict with a fresh ``run_id``."""
    t0 = time.perf_counter()
    entry = CatalogEntry(**job["entry"])
    s3_config = None if job.get("s3_config") is None else S3Config(**job["s3_config"])
    store = open_store(job["store"], endpoint_url=job["s3_endpoint"], s3_config=s3_config)
    base = {"template_id": entry.template_id, "key": entry.key, "pid": os.getpid(), "host": socket.gethostname()}
    if published_key(store, entry.template_id) == entry.key:
        return {**base, "status": "skipped", "seconds": round(time.perf_counter() - t0, 3)}
    model = _model(entry.model, job["device"], job["dtype"])
    image, source = read_template_image(entry.image)
    result = publish_template(
        store,
        model,
        image,
        entry.template_id,
        codec=entry.codec,
        shard_layers=entry.shard_layers,
        seed=entry.seed,
        source=source,
        overwrite=True,
        kv_mode=entry.kv_mode,
        steps=entry.steps,
        shift=entry.shift,
        template_size=entry.template_size,
        annotations={"catalog_entry": entry.key},
        store_profile=entry.store_profile,
    )
    return {
        **base,
        "status": "published",
        "run_id": uuid.uuid4().hex,
        "shards": result.shards,
        "bytes": result.shard_bytes,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _failed(job: dict, error: str) -> dict:
    return {"template_id": job["entry"]["template_id"], "key": job["entry"]["key"], "status": "failed", "error": error}


class LocalRunner:
    """``workers`` processes on this machine (spawned, ``threads`` torch threads each); a worker that dies (killed,
    out of memory) breaks the pool: the pool is started again and its unfinished entries retried up to ``retries``
    times."""

    def __init__(
        self, workers: int, *, threads: int | None = None, retries: int = 2, progress: Progress | None = None
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers, self.retries = workers, retries
        self.threads = threads or max(1, (os.cpu_count() or 1) // workers)
        self.progress = progress or (lambda result: None)

    def run(self, jobs: list[dict]) -> list[dict]:
        """Run every job; one result per job, in order (jobs with one key share one run)."""
        unique: dict[str, dict] = {}
        for job in jobs:
            unique.setdefault(job["entry"]["key"], job)
        results: dict[str, dict] = {}
        attempts = dict.fromkeys(unique, 0)
        pending = list(unique)
        while pending:
            pending = self._round(pending, unique, attempts, results)
        return [results[job["entry"]["key"]] for job in jobs]

    def _round(self, keys: list[str], unique: dict, attempts: dict, results: dict) -> list[str]:
        """One pool over ``keys``; returns the keys to retry in a fresh pool."""
        retry = []
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        with concurrent.futures.ProcessPoolExecutor(
            min(self.workers, len(keys)), mp_context=ctx, initializer=_init_worker, initargs=(self.threads,)
        ) as pool:
            futures = {pool.submit(run_entry, unique[k]): k for k in keys}
            for fut in concurrent.futures.as_completed(futures):
                key = futures[fut]
                try:
                    results[key] = fut.result()
                except BrokenProcessPool as e:
                    attempts[key] += 1
                    if attempts[key] <= self.retries:
                        retry.append(key)
                        continue
                    results[key] = _failed(unique[key], f"worker died {attempts[key]} times: {e}")
                except Exception as e:  # the entry's own error: reported, not retried (it would fail again)
                    results[key] = _failed(unique[key], f"{type(e).__name__}: {e}")
                self.progress(results[key])
        if retry:
            logger.warning("a worker process died; retrying %d unfinished entr(ies) in a new pool", len(retry))
        return retry
