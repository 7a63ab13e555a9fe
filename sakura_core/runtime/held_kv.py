""":class:`HeldKV`: the template KV the device holds during a pipelined edit, and each shard's state — the meeting
point of the fetch lane (which publishes decoded shards or marks them failed) and the compute lane (which waits for
a shard, reads it, adds the KV of a fallback template pass, and frees what it has passed).

Per shard: the decoded KV and its level (a finer level replaces a coarser one, never the reverse), the device's own
KV after a failed shard, a ``ready`` event (set once the shard is decoded or has failed) and ``failed``. The bytes
held are counted (``kv_bytes``, its peak ``peak_kv_bytes``); in per-step mode a shard serves one (step, layer) only,
and :meth:`release_before` frees every shard the compute lane has passed. One lock (``lock``) guards it all: the
fetch lane writes from the event loop, the compute lane from its thread.
"""

from __future__ import annotations

import threading

import torch

from .shard_index import ShardGrid, ShardId

__all__ = ["HeldKV"]

KV = tuple[torch.Tensor, torch.Tensor]  # (k, v), each (ref_tokens, heads, head_dim) or with a batch of 1 in front


class HeldKV:
    """The KV the device holds, per shard of ``grid`` (see the module docstring); :meth:`reset` empties it."""

    def __init__(self, grid: ShardGrid) -> None:
        self.grid = grid
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        self.kv: dict[ShardId, tuple[torch.Tensor, torch.Tensor, int]] = {}  # fetched: (k, v, level)
        self.device_kv: dict[ShardId, KV] = {}  # computed here after a failed or late shard
        self.ready = {shard: threading.Event() for shard in self.grid}
        self.failed: set[ShardId] = set()
        self.kv_bytes = self.peak_kv_bytes = 0  # template KV held now (fetched + the device's), and its peak
        self.shard_kv_nbytes = 0  # one decoded shard's K and V (0 until one is decoded)
        self.released_below = 0  # per-step: shards with g below this served their (step, layer): their KV is freed

    # ---- the fetch lane's side

    def publish(self, shard: ShardId, k: torch.Tensor, v: torch.Tensor, level: int) -> bool:
        """Keep ``shard``'s decoded KV at ``level`` unless a finer level is held; False when the compute lane has
        passed the shard already (per-step: a late upgrade is not kept). Does not set ``ready``."""
        with self.lock:
            if shard.g < self.released_below:
                return False
            old = self.kv.get(shard)
            if old is None or old[2] < level:
                self.kv[shard] = (k, v, level)
                self.shard_kv_nbytes = k.nbytes + v.nbytes
                self._count(added=(k, v), removed=old[:2] if old is not None else ())
            return True

    def set_ready(self, shard: ShardId) -> None:
        self.ready[shard].set()

    def fail(self, shard: ShardId) -> None:
        """The shard will not come: the compute lane uses the device's KV for it."""
        self.failed.add(shard)
        self.ready[shard].set()

    def give_up(self, shard: ShardId) -> None:
        """The compute lane waited too long for ``shard``: it uses the device's KV for it (whatever comes later)."""
        self.failed.add(shard)

    def fail_pending(self, shards) -> None:
        """Every shard of ``shards`` not decoded yet will not come (the policy gave up on the link for them)."""
        for shard in shards:
            if not self.ready[shard].is_set():
                self.failed.add(shard)

    def is_held(self, shard: ShardId) -> bool:
        with self.lock:
            return shard in self.kv

    def held_from_bytes(self, g: int) -> int:
        """Decoded KV held for shards from flat index ``g`` on (the later steps' prefetch)."""
        with self.lock:
            return sum(k.nbytes + v.nbytes for s, (k, v, _) in self.kv.items() if s.g >= g)

    # ---- the compute lane's side

    def is_ready(self, shard: ShardId) -> bool:
        return self.ready[shard].is_set()

    def is_failed(self, shard: ShardId) -> bool:
        return shard in self.failed

    def fetched(self, shard: ShardId) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The decoded ``(k, v, level)`` of a ready shard that did not fail."""
        with self.lock:
            return self.kv[shard]

    def device(self, shard: ShardId) -> KV | None:
        """The device's own KV for ``shard`` (from a fallback template pass), if computed."""
        with self.lock:
            return self.device_kv.get(shard)

    def hold_device(self, kv_from: dict[ShardId, KV]) -> None:
        """Keep the KV a fallback template pass computed, for the shards the compute lane has not passed."""
        with self.lock:
            for shard, kv in kv_from.items():
                if shard.g >= self.released_below:
                    self.device_kv[shard] = kv
                    self._count(added=kv)

    def release_before(self, g: int) -> range:
        """Per-step mode: the compute lane is at flat index ``g``; every shard before it served its (step, layer)
        and is never used again: free their KV, fetched and the device's. Returns the flat indices released now."""
        with self.lock:
            lo = self.released_below
            if g <= lo:
                return range(0)
            self.released_below = g
            for shard in (self.grid[x] for x in range(lo, g)):
                entry, own = self.kv.pop(shard, None), self.device_kv.pop(shard, None)
                self._count(removed=(*(entry[:2] if entry else ()), *(own or ())))
            return range(lo, g)

    def held_bytes(self) -> int:
        """The KV held now, counted tensor by tensor (what ``kv_bytes`` must equal)."""
        with self.lock:
            kv = sum(k.nbytes + v.nbytes for k, v, _ in self.kv.values())
            return kv + sum(k.nbytes + v.nbytes for k, v in self.device_kv.values())

    def _count(self, added=(), removed=()) -> None:
        self.kv_bytes += sum(t.nbytes for t in added) - sum(t.nbytes for t in removed)
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes)
