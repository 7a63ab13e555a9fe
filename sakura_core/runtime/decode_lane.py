"""The decode lane of :class:`~sakura_core.runtime.pipeline.PipelinedEdit` and the template KV the device holds.

A shard's chain is decoded in the thread pool by one :class:`~sakura_core.kv.chain.ChainDecoder` per shard, kept
while an upgrade may extend it, so an upgrade fetches and applies only its new blobs (no blob is kept after it is
decoded). The decoded KV is counted (``kv_bytes``, ``peak_kv_bytes``); in per-step mode a shard serves one (step,
layer) only and is freed once the compute lane has passed it — in a cross-step template, and with a policy that may
fetch residual levels, once the same layer of the next step is decoded too (that residual is decoded against it).

A cross-step residual is decoded against the reference shard's KV as the device holds it (decoded from any of its
levels, or computed by the device's fallback pass): :meth:`DecodeLane.reference_for`; without it the shard is not
fetched and falls back (:class:`~sakura_core.kv.chain.MissingReferenceError`, in the report's ``fallbacks``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..kv.binding import check_shard_binding, slot_from_manifest
from ..kv.chain import ChainDecoder, DecodedReference, MissingReferenceError

__all__ = ["DecodeLane"]


class DecodeLane:
    """Mixin: decoding and the KV held (state lives on the edit: ``kv``, ``decoders``, ``decoder_lock``,
    ``fallback_kv``, ``dropped``, ``kv_bytes``, ``peak_kv_bytes``, ``released_below``, ``st``, ...)."""

    def decoded_prefix(self, layer: int, digests: list[str]) -> int:
        """How many of ``digests`` (a chain) this layer's decoder has applied already: the chain extends what it
        decoded (an upgrade); 0 when there is no decoder or the chain starts afresh."""
        with self.decoder_lock:
            done = self.decoders.get(layer, ([], None))[0]
        ok = 0 < len(done) < len(digests) and digests[: len(done)] == done
        return len(done) if ok else 0

    def reference_for(self, g: int, rep: dict) -> DecodedReference | None:
        """The decoded reference a cross-step residual representation ``rep`` of shard ``g`` needs (``None`` for a
        self-contained one); raises MissingReferenceError when the device holds no KV of the reference shard."""
        ref = rep.get("ref")
        if ref is None or ref.get("mode") != "residual":
            return None
        gr = ref["step"] * self.L + g % self.L
        with self.st.lock:
            entry = self.kv.get(gr)
            kv = (entry[0], entry[1]) if entry is not None else self.fallback_kv.get(gr)
        if kv is None:
            raise MissingReferenceError(
                f"its level {rep['name']} is coded against step {ref['step']} layer {g % self.L}, which the device "
                "does not hold (not fetched, or freed)"
            )
        k, v = (np.ascontiguousarray(t.detach().to(torch.float16).reshape(1, *t.shape[-3:]).numpy()) for t in kv)
        return DecodedReference(ref["step"], ref["digest"], k, v)

    def decode_shard(
        self, layer: int, level: int, digests: list[str], blobs: list[bytes], start: int = 0, reference=None
    ):
        """Decode ``blobs`` = ``digests[start:]``: with ``start`` > 0 on top of this layer's decoder, which has applied
        ``digests[:start]`` (an upgrade applies only its new blobs); else a new decoder. ``reference``: the decoded
        reference of a cross-step residual (:meth:`reference_for`)."""
        t0 = self.st.now
        with self.decoder_lock:
            done, dec = self.decoders.pop(layer, ([], None))
        if start:
            if dec is None or done != digests[:start]:
                raise RuntimeError(f"shard {layer}: the decoder no longer holds the chain prefix this upgrade extends")
        else:
            dec = ChainDecoder()
        for blob in blobs:  # on an error the half-advanced decoder stays dropped (popped above)
            dec.push(blob)
        # the blob must be the one this slot needs, not just the one the manifest names (a corrupt shard if not)
        step = layer // self.L if self.per_step else None
        check_shard_binding(
            dec.header, slot_from_manifest(self.manifest, layer % self.L, self.reps[layer][level], step)
        )
        dec.set_reference(reference)
        k, v = dec.tensors()
        with self.decoder_lock:
            self.decoders[layer] = (list(digests), dec)
        self.event("decode", t0, self.st.now, layer, self.ladders[layer][level].name)
        return k, v

    def hold_kv(self, g: int, entry: tuple[torch.Tensor, torch.Tensor, int]) -> None:
        """Keep shard ``g``'s decoded KV (replacing a coarser one); the caller holds ``st.lock``."""
        old = self.kv.get(g)
        self.kv[g] = entry
        self.shard_kv_nbytes = entry[0].nbytes + entry[1].nbytes
        self._count_kv(entry[:2], old[:2] if old is not None else ())

    def _count_kv(self, added=(), removed=()) -> None:
        self.kv_bytes += sum(t.nbytes for t in added) - sum(t.nbytes for t in removed)
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes)

    def release_before(self, g: int) -> None:
        """Per-step mode: the compute lane is at shard ``g``; every shard before it served its (step, layer) and is
        never used again: free their KV (fetched and the device's), decoders, and the template state kept at the
        drops of steps before ``g``'s. The device holds the rest of the running step and what is prefetched for
        later steps, not the whole edit's KV. The caller holds ``st.lock``."""
        lo = self.released_below
        if g <= lo:
            return
        self.released_below = g
        with self.decoder_lock:
            for x in sorted({*range(lo, g), *self.kept_refs}):
                if self._reference_pending(x):  # freed at a later call, once the shard it serves is decoded
                    self.kept_refs.add(x)
                    continue
                self.kept_refs.discard(x)
                entry, fb = self.kv.pop(x, None), self.fallback_kv.pop(x, None)
                self._count_kv(removed=(*(entry[:2] if entry else ()), *(fb or ())))
                self.decoders.pop(x, None)
        for step in [s for s in self.dropped if s < g // self.L]:
            del self.dropped[step]

    def keep_device_kv(self, step: int, extracted: list) -> None:
        """The template KV the device computed at ``step`` (layers below its split): kept, like a fallback pass's,
        where the next step's same layer may be fetched as a residual against it (per-step mode)."""
        if not self.per_step:
            return
        with self.st.lock:
            for layer, (k, v) in enumerate(extracted):
                g = step * self.L + layer
                if g not in self.fallback_kv and self._reference_pending(g):
                    self.fallback_kv[g] = (k, v)
                    self._count_kv(added=(k, v))

    def _reference_pending(self, x: int) -> bool:
        """Shard ``x`` is the reference of the same layer of the next step, which may still be fetched at a residual
        level (this policy's ladder has one) and is not decoded yet: it stays held until then."""
        nxt = x + self.L
        if nxt >= len(self.ladders) or nxt in self.failed or self.ready[nxt].is_set():
            return False
        return any(lv.ref_step == x // self.L for lv in self.ladders[nxt])

    def held_ahead_bytes(self) -> int:
        """Decoded KV held for steps after the running one (the caller holds ``st.lock``)."""
        end = (max(self.step, 0) + 1) * self.L
        return sum(k.nbytes + v.nbytes for g, (k, v, _) in self.kv.items() if g >= end)
