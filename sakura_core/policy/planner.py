"""Receding-horizon plan over the remaining (step, layer) shards (the sakura policy's model of the edit).

A plan is one template split ``k_s`` per remaining step: step ``s`` runs the template tokens through layers
``< k_s`` on the device and uses the fetched shards ``(s, l >= k_s)``; shards are fetched back to back in
execution order (later steps prefetched while earlier ones compute) at the floor level. :class:`Snapshot` takes
what is known at one moment (decoded shards, predicted in-flight ones, the compute position) and predicts the
edit's finish for a split vector in O(shards) with numpy: arrivals are a cumulative sum at a constant rate, the
decode lane and each step's compute lane are max-plus recurrences. :func:`best_plan` searches the split vector by
coordinate descent (every split of one step with the others fixed, from the best uniform split); re-planned at
every decision, so estimation error is corrected as transfers complete (RobustMPC's receding horizon).

With ``rate=None`` transfers follow the trace exactly (the oracle's static search), one shard at a time.
In ``single`` KV mode there is one plan step (step 0's split); later steps run cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .context import Context

__all__ = ["Plan", "Snapshot", "best_plan"]


@dataclass(frozen=True)
class Plan:
    """``splits[i]``: the split of step ``first_step + i``; ``finish_s``: predicted end of the edit (seconds)."""

    first_step: int
    splits: tuple[int, ...]
    finish_s: float

    def split(self, step: int) -> int:
        return self.splits[step - self.first_step]


class Snapshot:
    """What is known now, frozen for the search. ``rate``: bytes/s for transfers not yet decoded (None = the trace).
    ``nbytes`` overrides the floor size of the next undecided shard (level choice)."""

    def __init__(self, ctx: Context, rate: float | None, fetch_from: int | None = None):
        p = ctx.profile
        self.ctx, self.rate = ctx, rate
        self.L, self.N = ctx.layers_per_step, ctx.num_layers
        self.per_step = ctx.per_step
        self.S = ctx.steps if self.per_step else 1
        self.F, self.C = p.layer_full_s, p.layer_cached_s
        self.tail = p.fixed_s + (0.0 if self.per_step else (p.model.steps - 1) * self.L * p.layer_cached_s)
        self.c = ctx.compute_layer
        self.cs, self.l0 = ctx.step_of(self.c), ctx.layer_of(self.c)
        self.alive = ctx.template_alive
        self.ct = max(ctx.compute_t, ctx.now)
        self.rtt = ctx.rtt_s
        fl = ctx.floor
        self.nb = np.array([ctx.ladder(g)[fl].nbytes for g in range(self.N)], dtype=float)
        self.dec = np.array([ctx.ladder(g)[fl].decode_s for g in range(self.N)], dtype=float)
        known = np.full(self.N, np.nan)
        for g in range(self.c, self.N):
            r = ctx.known_ready(g)
            if r is not None:
                known[g] = r
        self.known = known
        prog = ctx.link_progress()
        if prog is not None and rate is not None:  # in-flight shards: no sooner than the link's progress allows
            pending = [g for g in range(self.c, self.N) if not np.isnan(known[g]) and not ctx.ready(g)]
            t = ctx.now + max(prog[2] - prog[1], 0.0) / rate
            for i, g in enumerate(pending):
                t = t if i == 0 else t + self.rtt + self.nb[g] / rate
                known[g] = max(known[g], t + self.dec[g])
        self.link0 = max(ctx.now, ctx.link_busy_until())
        self.nl = ctx.decided_upto if fetch_from is None else fetch_from
        self.layer = np.arange(self.N) % self.L
        self.step = np.arange(self.N) // self.L if self.per_step else np.zeros(self.N, dtype=int)

    def lows(self) -> list[int]:
        """Smallest split each plan step may take (the current step cannot undo layers already run)."""
        lo = [0] * (self.S - self.cs)
        lo[0] = self.l0 if self.alive else self.l0
        return lo

    def pending(self, splits) -> int:
        """Shards the plan ``splits`` still needs that are not requested yet."""
        k = np.concatenate([np.full(self.cs, self.L), np.array(splits, dtype=int)])
        need = self.layer >= k[self.step]
        need[: self.c] = False
        return int(np.count_nonzero(need & np.isnan(self.known)))

    def finish(self, splits, first_nbytes: float | None = None, first_dec: float | None = None,
               upto_step: int | None = None) -> float:  # fmt: skip
        """Predicted end of the edit (seconds) with ``splits`` for steps cs.. (the current step's is ignored once
        the template is dropped); ``first_nbytes`` / ``first_dec``: the next undecided shard at another level;
        ``upto_step``: the end of that step instead (no tail)."""
        L, c = self.L, self.c
        k = np.array(splits, dtype=int)
        if not self.alive:
            k[0] = self.l0
        kk = np.concatenate([np.full(self.cs, L), k])  # earlier steps: nothing needed
        need = self.layer >= kk[self.step]
        need[:c] = False
        unknown = need & np.isnan(self.known)
        ready = self.known.copy()
        idx = np.nonzero(unknown)[0]
        if idx.size:
            nb, d = self.nb[idx], self.dec[idx]
            pos = int(np.searchsorted(idx, self.nl))
            if first_nbytes is not None and pos < idx.size and idx[pos] == self.nl:
                nb, d = nb.copy(), d.copy()
                nb[pos] = first_nbytes
                d[pos] = d[pos] if first_dec is None else first_dec
            arrive = self._arrivals(nb)
            dc = np.cumsum(d)
            ready[idx] = dc + np.maximum(np.maximum.accumulate(arrive - (dc - d)), self.link0)
        t = self.ct
        last = self.S if upto_step is None else upto_step + 1
        for i, s in enumerate(range(self.cs, last)):
            start = self.l0 if i == 0 else 0
            ks = max(int(k[i]), start)
            base = s * L
            t += (ks - start) * self.F if (i > 0 or self.alive) else 0.0
            if ks < L:
                r = ready[base + ks : base + L] + self.C * np.arange(L - ks, 0, -1)
                t = max(t + (L - ks) * self.C, float(r.max()))
        return t if upto_step is not None else t + self.tail

    def _arrivals(self, nb: np.ndarray) -> np.ndarray:
        if self.rate is not None:
            return self.link0 + np.cumsum(self.rtt + nb / self.rate)
        out, t = np.empty(nb.size), self.link0
        for i, b in enumerate(nb):
            t = self.ctx.transfer_end(t, float(b), None)
            out[i] = t
        return out


def best_plan(snap: Snapshot, init: tuple[int, ...] | None = None, rounds: int = 2) -> Plan:
    """The split vector with the earliest predicted finish: best uniform split (or ``init``), then coordinate
    descent over each step's split."""
    n, L = snap.S - snap.cs, snap.L
    lo = snap.lows()

    def clip(v):
        return tuple(max(lo[i], min(L, int(x))) for i, x in enumerate(v))

    best, best_t = None, float("inf")
    cands = [clip([k] * n) for k in range(L + 1)]
    if init is not None and len(init) == n:
        cands.insert(0, clip(init))
    for v in cands:
        t = snap.finish(v)
        if t < best_t - 1e-12:
            best, best_t = v, t
    if n > 1 or (n == 1 and not snap.alive):
        for _ in range(rounds):
            improved = False
            for i in range(n):
                if i == 0 and not snap.alive:
                    continue
                for k in range(lo[i], L + 1):
                    if k == best[i]:
                        continue
                    v = best[:i] + (k,) + best[i + 1 :]
                    t = snap.finish(v)
                    if t < best_t - 1e-12:
                        best, best_t, improved = v, t, True
            if not improved:
                break
    return Plan(snap.cs, best, best_t)
