"""The server's store reads off the event loop: a bounded thread pool of their own, with a cap per object.

asyncio's default executor is shared by everything in the process and small (``min(32, cpus + 4)`` threads): a few
reads of one stalled S3 object would hold all of it, and every other request served from the store would wait. A
:class:`StoreIO` gives store reads ``threads`` threads of their own, and lets one object (a shard, a manifest, the
catalog) hold at most ``threads_per_object`` of them: further reads of that object wait for a free slot of their own
without holding a thread, so a stalled object delays only its own requests. A slot is held until its thread is done,
even when the request that started it is gone (its client left), so the cap counts threads, not requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["StoreIO"]

T = TypeVar("T")


class StoreIO:
    """Store reads on their own bounded thread pool (see the module docstring).

    Args:
        threads: threads of the pool (store reads at once).
        threads_per_object: threads reads of one object may hold at once.
    """

    def __init__(self, threads: int = 32, threads_per_object: int = 4):
        if threads < 1 or not 1 <= threads_per_object <= threads:
            raise ValueError(
                f"StoreIO needs threads >= 1 and 1 <= threads_per_object <= threads; got {threads}, "
                f"{threads_per_object}"
            )
        self.threads, self.threads_per_object = threads, threads_per_object
        self._executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sakura-store-io")
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    async def run(self, key: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a store thread, once reads of ``key`` hold fewer than ``threads_per_object`` threads."""
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = asyncio.Semaphore(self.threads_per_object)
        self._users[key] = self._users.get(key, 0) + 1
        try:
            await slots.acquire()
        except BaseException:
            self._leave(key)
            raise
        try:
            fut = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        except BaseException:
            slots.release()
            self._leave(key)
            raise
        fut.add_done_callback(functools.partial(self._done, key, slots))
        return await asyncio.shield(fut)  # a cancelled request leaves its thread (and slot) until the read ends

    def _done(self, key: str, slots: asyncio.Semaphore, fut: asyncio.Future) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieved here: the error of a read whose request left is not logged by asyncio
        slots.release()
        self._leave(key)

    def _leave(self, key: str) -> None:
        left = self._users[key] - 1
        if left:
            self._users[key] = left
        else:
            del self._users[key], self._slots[key]

    def shutdown(self) -> None:
        """Stop taking reads; reads running now finish on their threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)
