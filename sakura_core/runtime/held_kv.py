""":class:`HeldKV`: the template KV the device holds during a pipelined edit, and each shard's state — the meeting
point of the fetch lane (which publishes decoded shards or marks them failed) and the compute lane (which waits for
a shard, reads it, adds the KV of a fallback template pass, and frees what it has passed).

Per shard: the decoded KV and its level (a finer level replaces a coarser one, never the reverse), the device's own
KV after a failed shard, a ``ready`` event (set once the shard is decoded or has failed) and ``failed``. The bytes
held are counted (``kv_bytes``, its peak ``peak_kv_bytes``); in per-step mode a shard serves one (step, layer) only,
and :meth:`release_before` frees every shard the compute lane has passed. One lock (``lock``) guards it all: the
fetch lane writes from the event loop, the compute lane from its thread.

Cross-step templates: a residual level of shard (s, layer) decodes against the KV the device holds of its reference
shard (s', layer) — decoded at any level, or computed here (a fallback pass, or the template layers the device ran at
step s': :meth:`keep_references`); a closed-loop twin only against the one representation it names (``source``
records which representation each fetched KV was decoded from; :meth:`closed_twin`). :meth:`reference_for` gives it
(or raises :class:`~sakura_core.kv.chain.MissingReferenceError`); a passed shard stays held only while a shard that
may still be fetched at a residual level against it is not decoded (:meth:`release_before`).

Re-roots (:mod:`sakura_core.policy.reroot`): a chain shard the compute lane has passed is decoded only as the next
one's reference; the fetch lane keeps its KV apart (:meth:`hold_chain`, counted in ``kv_bytes``) until the next one
is decoded, then frees it (:meth:`drop_chain`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from ..kv.chain import DecodedReference, MissingReferenceError
from ..kv.manifest import Representation
from ..kv.manifest_schema import CLOSED_REF_MODE, DECODED_REF_MODES
from ..policy.ladder import Level, PlannedRep
from .shard_index import ShardGrid, ShardId

__all__ = ["HeldKV"]

KV = tuple[torch.Tensor, torch.Tensor]  # (k, v), each (ref_tokens, heads, head_dim) or with a batch of 1 in front


class HeldKV:
    """The KV the device holds, per shard of ``grid`` (see the module docstring); :meth:`reset` empties it.

    Args:
        grid: the edit's shards.
        ladders: per shard (flat index) the levels the policy may fetch; a level with ``ref_step`` makes the same
            layer of that step a reference, kept past the compute lane while the shard may still need it.
    """

    def __init__(self, grid: ShardGrid, ladders: list[list[Level]] | None = None) -> None:
        self.grid = grid
        self.lock = threading.RLock()
        # called (from the thread that made it) once the device's own KV was offered
        self.on_device_kv: Callable[[], object] | None = None
        self.dependents: dict[ShardId, list[ShardId]] = {}  # reference shard -> shards with a residual level on it
        for shard in grid if ladders is not None else ():
            levels = ladders[shard.g] if ladders is not None else []  # (not None here: the loop's condition)
            for step in sorted({lv.ref_step for lv in levels if lv.ref_step is not None}):
                self.dependents.setdefault(grid.at(step, shard.layer), []).append(shard)
        self.reset()

    def reset(self) -> None:
        self.kv: dict[ShardId, tuple[torch.Tensor, torch.Tensor, int]] = {}  # fetched: (k, v, level)
        # fetched: (digest, name) of the representation the KV was decoded from (the last blob of its chain)
        self.source: dict[ShardId, tuple[str | None, str | None]] = {}
        self.blobs: dict[ShardId, tuple[tuple[str, int], ...]] = {}  # fetched: its chain's (digest, wire bytes)
        self.device_kv: dict[ShardId, KV] = {}  # computed here after a failed or late shard
        self.ready = {shard: threading.Event() for shard in self.grid}
        self.failed: set[ShardId] = set()
        self.kv_bytes = self.peak_kv_bytes = 0  # template KV held now (fetched + the device's), and its peak
        self.shard_kv_nbytes = 0  # one decoded shard's K and V (0 until one is decoded)
        self.released_below = 0  # per-step: shards with g below this served their (step, layer): their KV is freed
        self.kept: set[ShardId] = set()  # passed shards still held as the reference of a shard not decoded yet
        # re-root chain shards the compute lane has passed: (k, v, digest), only the next chain shard's reference
        self.chain_kv: dict[ShardId, tuple[torch.Tensor, torch.Tensor, str]] = {}

    # ---- the fetch lane's side

    def publish(
        self,
        shard: ShardId,
        k: torch.Tensor,
        v: torch.Tensor,
        level: int,
        digest: str | None = None,
        name: str | None = None,
        blobs: tuple[tuple[str, int], ...] = (),
    ) -> bool:
        """Keep ``shard``'s decoded KV at ``level`` (decoded from the representation ``digest`` called ``name``:
        the last blob of its chain; ``blobs``: the chain's ``(digest, bytes on the wire)``) unless a finer level is
        held; False when the compute lane has passed the shard already (per-step: a late upgrade is not kept). Does
        not set ``ready``."""
        with self.lock:
            if shard.g < self.released_below:
                return False
            old = self.kv.get(shard)
            if old is None or old[2] < level:
                self.kv[shard] = (k, v, level)
                self.source[shard] = (digest, name)
                self.blobs[shard] = tuple(blobs)
                self.shard_kv_nbytes = k.nbytes + v.nbytes
                self._count(added=(k, v), removed=old[:2] if old is not None else ())
            return True

    def hold_chain(self, shard: ShardId, k: torch.Tensor, v: torch.Tensor, digest: str) -> None:
        """Keep a passed re-root chain shard's KV (decoded from representation ``digest``) as the reference of the
        next one (:meth:`reference_for`, :meth:`closed_twin`) until :meth:`drop_chain`."""
        with self.lock:
            old = self.chain_kv.pop(shard, None)
            self.chain_kv[shard] = (k, v, digest)
            self._count(added=(k, v), removed=old[:2] if old is not None else ())

    def drop_chain(self, shard: ShardId) -> None:
        """Free a re-root chain shard's KV (:meth:`hold_chain`): the next one is decoded, or the chain has ended."""
        with self.lock:
            old = self.chain_kv.pop(shard, None)
            if old is not None:
                self._count(removed=old[:2])

    def set_ready(self, shard: ShardId) -> None:
        self.ready[shard].set()

    def fail(self, shard: ShardId) -> None:
        """The shard will not come: the compute lane uses the device's KV for it."""
        self.failed.add(shard)
        self.ready[shard].set()

    def give_up(self, shard: ShardId) -> None:
        """The compute lane waited too long for ``shard``: it uses the device's KV for it (whatever comes later)."""
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

    def arrived(self, shard: ShardId) -> bool:
        """Decoded KV of ``shard`` is here, also of one the compute lane gave up on (its transfer was not cancelled;
        a shard whose fetch failed has none)."""
        with self.lock:
            return self.ready[shard].is_set() and shard in self.kv

    def fetched(self, shard: ShardId) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The decoded ``(k, v, level)`` of a ready shard that did not fail (or that was given up on and then
        arrived: :meth:`arrived`)."""
        with self.lock:
            return self.kv[shard]

    def fetched_blobs(self, shard: ShardId) -> tuple[torch.Tensor, torch.Tensor, int, tuple[tuple[str, int], ...]]:
        """:meth:`fetched` and the blobs (``(digest, bytes on the wire)``, its chain) that KV was decoded from, read
        together."""
        with self.lock:
            return (*self.kv[shard], self.blobs.get(shard, ()))

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
        self._offered()

    def _offered(self) -> None:
        """The device offered its own KV (kept or not): who waits for a reference it makes looks again."""
        if self.on_device_kv is not None:
            self.on_device_kv()

    def release_before(self, g: int) -> range:
        """Per-step mode: the compute lane is at flat index ``g``; every shard before it served its (step, layer):
        free its KV, fetched and the device's — unless it is the reference of a shard that may still be fetched at
        a residual level and is not decoded (then it is freed at a later call, once that shard no longer needs it).
        Returns the flat indices passed now (their decoders are never used again)."""
        with self.lock:
            lo = self.released_below
            if g <= lo:
                return range(0)
            self.released_below = g
            for shard in sorted({*(self.grid[x] for x in range(lo, g)), *self.kept}):
                if self._referenced(shard):
                    self.kept.add(shard)
                    continue
                self.kept.discard(shard)
                entry, own = self.kv.pop(shard, None), self.device_kv.pop(shard, None)
                self.source.pop(shard, None)
                self.blobs.pop(shard, None)
                self._count(removed=(*(entry[:2] if entry else ()), *(own or ())))
            return range(lo, g)

    # ---- cross-step references

    def keep_references(self, kv_from: dict[ShardId, KV]) -> None:
        """The template KV the device computed itself (the layers it ran at a step): kept for the shards that are
        still the reference of a shard not decoded yet and not held already; the rest is not kept."""
        with self.lock:
            for shard, kv in kv_from.items():
                if shard in self.kv or shard in self.device_kv or not self._referenced(shard):
                    continue
                self.device_kv[shard] = kv
                self._count(added=kv)
                if shard.g < self.released_below:
                    self.kept.add(shard)
        self._offered()

    def reference_for(self, shard: ShardId, rep: Representation) -> DecodedReference | None:
        """The decoded reference that representation ``rep`` (a manifest entry) of ``shard`` needs: None for a
        self-contained one; the KV held of its reference shard (fetched at any level, or the device's own) for a
        cross-step residual. Raises MissingReferenceError when the device holds none."""
        ref = rep.ref
        if ref is None or ref.mode not in DECODED_REF_MODES:
            return None
        ref_shard = self.grid.at(ref.step, shard.layer)
        with self.lock:
            entry = self.kv.get(ref_shard) or self.chain_kv.get(ref_shard)
            kv = entry[:2] if entry is not None else self.device_kv.get(ref_shard)
            source = self._source_digest(ref_shard)
        if kv is None:
            raise MissingReferenceError(
                f"its level {rep.name} is coded against step {ref.step} layer {shard.layer}, which the device "
                "does not hold (not fetched, or freed)"
            )
        if ref.mode == CLOSED_REF_MODE and source != ref.digest:
            raise MissingReferenceError(
                f"its closed-loop level {rep.name} is coded against one representation of step {ref.step} "
                f"layer {shard.layer} ({ref.digest[:12]}…); the device holds "
                + ("its own KV of it" if source is None else f"another ({source[:12]}…)")
            )
        # (1, ref_tokens, heads, head_dim) float16: the shard's one layer, as the codec decodes it
        k, v = (np.ascontiguousarray(t.detach().to(torch.float16).reshape(1, *t.shape[-3:]).numpy()) for t in kv)
        return DecodedReference(ref.step, ref.digest, k, v)

    def closed_twin(self, shard: ShardId, rep: PlannedRep) -> Representation | None:
        """The closed-loop twin of representation ``rep`` of ``shard`` (``rep.closed_twin``, from
        :func:`~sakura_core.policy.ladder.rungs_from_manifest`) when the device holds the one representation of
        its reference it is coded against — then it replaces ``rep`` (fewer bytes, no error carried over); else
        None."""
        twin = rep.closed_twin
        if twin is None or twin.ref is None:
            return None
        ref = twin.ref
        with self.lock:
            return twin if self._source_digest(self.grid.at(ref.step, shard.layer)) == ref.digest else None

    def _source_digest(self, shard: ShardId) -> str | None:
        """The digest of the representation ``shard``'s fetched KV was decoded from; None when none is fetched (or
        the device made it) or the publisher did not say (the caller holds the lock). A re-root chain shard's is its chain entry's."""
        if shard in self.kv:
            return self.source[shard][0]
        chain = self.chain_kv.get(shard)
        return chain[2] if chain is not None else None

    def source_name(self, shard: ShardId) -> str | None:
        """The name of the representation ``shard``'s fetched KV was decoded from (None: not said)."""
        with self.lock:
            return self.source.get(shard, (None, None))[1]

    def _referenced(self, shard: ShardId) -> bool:
        """``shard`` is the reference of a shard the compute lane has not passed, not decoded and not given up on
        (the caller holds the lock)."""
        return any(
            d.g >= self.released_below and not self.ready[d].is_set() and d not in self.failed
            for d in self.dependents.get(shard, ())
        )

    def held_bytes(self) -> int:
        """The KV held now, counted tensor by tensor (what ``kv_bytes`` must equal)."""
        with self.lock:
            kv = sum(k.nbytes + v.nbytes for k, v, _ in (*self.kv.values(), *self.chain_kv.values()))
            return kv + sum(k.nbytes + v.nbytes for k, v in self.device_kv.values())

    def _count(self, added=(), removed=()) -> None:
        self.kv_bytes += sum(t.nbytes for t in added) - sum(t.nbytes for t in removed)
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes)
