"""Catalog entries fanned out on a Ray cluster (``sakura precompute-catalog --ray ADDRESS``).

Each entry is a Ray task running :func:`~cloud_server.catalog_jobs.run_entry` with ``num_cpus=1`` and, for a CUDA
device, ``num_gpus=1`` (Ray then places it on a GPU node and sets ``CUDA_VISIBLE_DEVICES``). A task whose worker
dies (killed, node lost) is retried by Ray (``max_retries``); since a publish writes the manifest last, the dead
attempt left at most unreferenced shards, which the retry (same content, same names) reuses.

Coalescing across drivers: every driver hands its entries to one named, detached coordinator actor per namespace
(``sakura-precompute-coordinator``). It starts one task per entry key and gives every request for a key in flight
the same task's result, so two ``precompute-catalog`` runs (or a catalog listing an entry twice) precompute it once.
Workers open the store by URL and read S3 credentials from their own environment (the AWS variables or an instance
role), so no secret travels through Ray.
"""

from __future__ import annotations

import logging
import time

from .catalog_jobs import Progress, run_entry

__all__ = ["COORDINATOR", "PrecomputeCoordinator", "run_on_ray"]

logger = logging.getLogger(__name__)

COORDINATOR = "sakura-precompute-coordinator"


class PrecomputeCoordinator:
    """The Ray actor (async) behind coalescing: entry key -> the one task computing it (see the module docstring)."""

    def __init__(self) -> None:
        import ray

        self._task = ray.remote(run_entry)
        self._inflight: dict = {}
        self._started: dict[str, int] = {}

    async def run(self, job: dict, options: dict) -> dict:
        key = job["entry"]["key"]
        ref = self._inflight.get(key)
        coalesced = ref is not None
        if ref is None:
            ref = self._task.options(**options).remote(job)
            self._inflight[key] = ref
            self._started[key] = self._started.get(key, 0) + 1
        try:
            result = await ref
        finally:
            if self._inflight.get(key) is ref:
                del self._inflight[key]
        return {**result, "coalesced": coalesced}

    def started(self) -> dict[str, int]:
        """How many tasks this coordinator started, per entry key (one per coalesced group)."""
        return dict(self._started)


def coordinator(namespace: str):
    """The cluster's coordinator actor (created on first use; needs ``ray.init`` with ``namespace``)."""
    import ray

    actor = ray.remote(num_cpus=0)(PrecomputeCoordinator)
    return actor.options(name=COORDINATOR, namespace=namespace, lifetime="detached", get_if_exists=True).remote()


def run_on_ray(
    jobs: list[dict],
    *,
    address: str,
    namespace: str = "sakura",
    progress: Progress | None = None,
    retries: int = 3,
    heartbeat_s: float = 15.0,
) -> list[dict]:
    """Run ``jobs`` on the Ray cluster at ``address``; one result per job, in order."""
    import ray

    progress = progress or (lambda result: None)
    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)
    try:
        gpu = any(str(job["device"]).startswith("cuda") for job in jobs)
        if gpu and ray.cluster_resources().get("GPU", 0) < 1:
            raise RuntimeError(f"--device cuda, but the Ray cluster at {address} has no GPU; use --device cpu")
        options = {"num_cpus": 1, "num_gpus": 1 if gpu else 0, "max_retries": retries, "name": "run_entry"}
        coord = coordinator(namespace)
        refs = [coord.run.remote(job, options) for job in jobs]
        logger.info("%d entr(ies) submitted to the coordinator %s", len(refs), COORDINATOR)
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, dict] = {}  # job index -> its result
        pending, t0, last = list(refs), time.monotonic(), time.monotonic()
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=heartbeat_s)
            for ref in done:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except ray.exceptions.RayError as e:
                    entry = jobs[i]["entry"]
                    results[i] = {
                        "template_id": entry["template_id"],
                        "key": entry["key"],
                        "status": "failed",
                        "error": f"{type(e).__name__}: {str(e)[-500:]}",
                    }
                progress(results[i])
            if not done or time.monotonic() - last >= heartbeat_s:
                last = time.monotonic()
                logger.info("%d of %d entries running or queued after %.0f s", len(pending), len(jobs), last - t0)
        return [results[i] for i in range(len(jobs))]
    finally:
        ray.shutdown()
