"""The decode lane of a pipelined edit (:class:`~sakura_core.runtime.pipeline.PipelinedEdit`): a thread pool that
turns a shard's fetched blobs into K/V.

A shard's chain is decoded by one :class:`~sakura_core.kv.chain.ChainDecoder` per shard, kept while an upgrade may
extend it, so an upgrade fetches and applies only its new blobs (no blob is kept after it is decoded). Every decoded
shard is checked against the slot the manifest gives it (a corrupt or misplaced shard raises: per-step manifests
bind the step, and a cross-step residual its reference). The lane owns its decoders and its pool; the fetch lane calls
:meth:`DecodeLane.decode` (with a residual's decoded reference) and publishes the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

from ..kv.binding import check_shard_binding, check_shard_geometry, slot_from_manifest
from ..kv.chain import ChainDecoder, DecodedReference
from ..kv.manifest import Manifest, Representation
from ..policy.ladder import Rung
from .live_state import LiveState
from .run_log import RunLog
from .shard_index import ShardId

__all__ = ["DecodeLane"]


class DecodeLane:
    """Decoders per shard and the pool they run in (``threads`` workers, open while :meth:`pool_open` is).

    Args:
        manifest: the template's manifest (each decoded shard is checked against its slot there).
        rungs: per shard (flat index), its ladder: the levels and their manifest entries.
        st: the run's live state (its clock times the decode events).
        log: the run's timeline.
        threads: decoder threads.
    """

    def __init__(
        self,
        manifest: Manifest,
        rungs: list[list[Rung]],
        st: LiveState,
        log: RunLog,
        threads: int,
    ) -> None:
        self.manifest, self.rungs, self.st, self.log = manifest, rungs, st, log
        self.per_step = manifest.kv_mode == "per-step"  # its shards' slots name their step
        self.threads = threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.reset()

    def reset(self) -> None:
        self.decoders: dict[ShardId, tuple[list[str], ChainDecoder]] = {}  # shard -> (digests pushed, its decoder)
        self.passed: set[ShardId] = set()  # shards whose decoder was dropped because they were served

    @contextlib.contextmanager
    def pool_open(self):
        """The decoder pool for one run: shut down (its decodes waited for) when the block ends."""
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="sakura-decode")
        try:
            yield self
        finally:
            self._pool.shutdown(wait=True)
            self._pool = None

    def decoded_prefix(self, shard: ShardId, digests: list[str]) -> int:
        """How many of ``digests`` (a chain) this shard's decoder has applied already: the chain extends what it
        decoded (an upgrade); 0 when there is no decoder or the chain starts afresh."""
        with self._lock:
            done = self.decoders.get(shard, ([], None))[0]
        ok = 0 < len(done) < len(digests) and digests[: len(done)] == done
        return len(done) if ok else 0

    async def decode(
        self,
        shard: ShardId,
        level: int,
        digests: list[str],
        blobs: list[bytes],
        start: int = 0,
        reference: DecodedReference | None = None,
    ):
        """``(k, v)`` of ``shard`` at ``level``, decoded in the pool from ``blobs`` = ``digests[start:]`` (see
        :meth:`decode_now`)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.decode_now, shard, level, digests, blobs, start, reference)

    def decode_now(
        self,
        shard: ShardId,
        level: int,
        digests: list[str],
        blobs: list[bytes],
        start: int = 0,
        reference: DecodedReference | None = None,
    ):
        """Decode ``blobs`` = ``digests[start:]``: with ``start`` > 0 on top of this shard's decoder, which has
        applied ``digests[:start]`` (an upgrade applies only its new blobs); else a new decoder. ``reference``: the
        decoded reference a cross-step residual adds to (``HeldKV.reference_for``), None for a self-contained level
        (or for an upgrade whose reference the device has freed since: its decoder keeps the one it was given).
        None (nothing decoded) for an upgrade of a shard served while its blobs came: its decoder is gone, and the
        upgrade is of no use any more."""
        t0 = self.st.now
        with self._lock:
            done, dec = self.decoders.pop(shard, ([], None))
            if start and dec is None and shard in self.passed:
                return None
        if start:
            if dec is None or done != digests[:start]:
                raise RuntimeError(f"{shard}: the decoder no longer holds the chain prefix this upgrade extends")
        else:
            dec = ChainDecoder()
        # the blob must be the one this slot needs, not just the one the manifest names (a corrupt shard if not): each
        # blob's header is checked against the slot's geometry before it is decompressed, the top one's level after
        rep: Representation = self.rungs[shard.g][level].rep
        twin = self.rungs[shard.g][level].rep.closed_twin
        if twin is not None and digests[-1] == twin.digest:  # the level's closed-loop twin, fetched in its place
            rep = twin
        slot = slot_from_manifest(self.manifest, shard.layer, rep, shard.step if self.per_step else None)
        for blob in blobs:  # on an error the half-advanced decoder stays dropped (popped above)
            dec.push(blob, lambda header: check_shard_geometry(header, slot))
        header = dec.header
        assert header is not None  # the chain holds at least the base blob here
        check_shard_binding(header, slot)
        if reference is not None or not start:  # an upgrade without one keeps the reference its decoder has
            dec.set_reference(reference)
        k, v = dec.tensors()
        with self._lock:
            self.decoders[shard] = (list(digests), dec)
        self.log.event("decode", t0, self.st.now, shard.g, rep.name)
        return k, v

    def forget(self, shard: ShardId) -> None:
        """Drop ``shard``'s decoder (it will not be upgraded: the compute lane has passed it)."""
        with self._lock:
            self.decoders.pop(shard, None)
            self.passed.add(shard)

    def release(self, shards) -> None:
        """Drop the decoders of ``shards`` (served: never upgraded again)."""
        with self._lock:
            for shard in shards:
                self.decoders.pop(shard, None)
                self.passed.add(shard)
