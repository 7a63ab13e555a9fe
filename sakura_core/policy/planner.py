"""Receding-horizon plan over the remaining (step, layer) shards (the sakura policy's model of the edit).

A plan is one template split ``k_s`` per remaining step: step ``s`` runs the template tokens through layers
``< k_s`` on the device and uses the fetched shards ``(s, l >= k_s)``; shards are fetched back to back in
execution order (later steps prefetched while earlier ones compute) at the floor level — on a twins'-track floor
(per-step, :mod:`sakura_core.precompute.cross_step`) the closed-loop twin's bytes while the layer stays on its track,
the open-loop floor's once a step computes it on the device (``Snapshot(track=True)``: the oracle's search, and
sakura's plans under the long-edit rule, :func:`track_priced`; the cut search below prices every shard on the track,
so there its candidates are compared by their exact finish, beside the held-split family: one split for every step).
:class:`Snapshot` takes what is known at one moment (decoded shards, predicted in-flight ones, the compute position)
and predicts the edit's finish for a split vector in O(shards) numpy operations: arrivals are a cumulative sum at a
constant rate, the decode lane and the compute lane max-plus recurrences, each a running maximum.

The search (:func:`best_plan`) is O(shards) numpy work per candidate family, not a search over split vectors.
Front-loading is optimal when the shards still to fetch cost the same (swap a fetched shard with a later
template layer: the layers between start later and their shards arrive no later, so no wait grows), so the plan
is a *cut*: the current step's split ``k``, then every later layer up to a cut position ``P`` on the device and
every one from ``P`` on fetched. For each ``k``, the finish of every ``P`` at once is a few running maxima
(:meth:`Snapshot.cut_table`, equal to :meth:`Snapshot.finish`: tested); the best (k, P) competes with the previous
plan's exact :meth:`Snapshot.finish`. Cost per decision: O((L + 1) x shards) numpy work, L the layers per step.

With ``rate=None`` transfers follow the trace exactly (the oracle's static search), one shard at a time; there the
cut is searched by exact evaluation and refined by coordinate descent over each step's split (the oracle runs
once per edit). In ``single`` KV mode there is one plan step (step 0's split); later steps run cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .context import Context
from .exact_chain import ExactChain, lead_rtts
from .reroot import chain_bytes, step_sums

__all__ = ["TRACK_RATIO", "Plan", "Snapshot", "best_plan", "track_priced"]

_NEG = -np.inf
# the long-edit rule: sakura prices the twins' track (and compares held splits beside the cuts) where the open-loop
# floor costs more than this many times the twins it stands in for (25-31x at 28 / 50 steps on the serving store,
# 0.85x at 4 steps: 4-step plans unchanged)
TRACK_RATIO = 4.0


def track_priced(ctx: Context) -> bool:
    """Per-step KV on a twins'-track floor whose open-loop floor costs more than :data:`TRACK_RATIO` times the twins
    (summed over the shards that have a twin): a layer computed on the device leaves its track for the rest of the
    edit, and plans must be priced with that (``Snapshot(track=True)``)."""
    if not ctx.per_step:
        return False
    nb, off = ctx.floor_arrays()[0], ctx.floor_off_track_bytes()
    twin = off != nb
    return bool(twin.any()) and sum(off[twin].tolist()) > TRACK_RATIO * sum(nb[twin].tolist())  # in order: as JS


@dataclass(frozen=True)
class Plan:
    """``splits[i]``: the split of step ``first_step + i``; ``finish_s``: predicted end of the edit (seconds)."""

    first_step: int
    splits: tuple[int, ...]
    finish_s: float

    def split(self, step: int) -> int:
        return self.splits[step - self.first_step]


def _suffix_max(x: np.ndarray) -> np.ndarray:
    """``out[i] = max(x[i:])`` (``-inf`` past the end: one extra element)."""
    out = np.full(x.size + 1, _NEG)
    if x.size:
        out[:-1] = np.maximum.accumulate(x[::-1])[::-1]
    return out


class Snapshot:
    """What is known now, frozen for the search. ``rate``: bytes/s for transfers not yet decoded (None = the trace).
    ``fetch_from`` overrides the next undecided shard (the one a level choice is about). ``track``: price a
    twins'-track floor by the plan (:meth:`_planned_bytes`: off the track once a step computes the layer) — the
    oracle's search does, and sakura's plans where the open-loop floor costs more than :data:`TRACK_RATIO` times the
    twins (:func:`track_priced`: 28- and 50-step edits); elsewhere sakura prices every shard on its track:
    track-aware plans drop the template earlier (computing a layer now costs its later steps the open-loop floor's
    bytes), a bet that loses on links that then fall, with long stalls (the comparison over traces at 4 steps, where
    the open-loop floor costs 0.85x the twins: `sakura bench e2e`)."""

    def __init__(self, ctx: Context, rate: float | None, fetch_from: int | None = None, track: bool = False):
        p = ctx.profile
        self.ctx, self.rate, self.track = ctx, rate, track
        self.L, self.N = ctx.layers_per_step, ctx.num_layers
        self.per_step = ctx.per_step
        self.S = ctx.steps if self.per_step else 1
        self.F, self.C = p.layer_full_s, p.layer_cached_s
        cores = float(getattr(p, "dit_cpu_cores", 0))
        self.share = 1.0 / cores if cores else 0.0  # a decode on the DiT's cores costs it decode_s / cores
        self.tail = p.fixed_s + (0.0 if self.per_step else (p.model.steps - 1) * self.L * p.layer_cached_s)
        self.c = ctx.compute_layer
        self.cs, self.l0 = ctx.step_of(self.c), ctx.layer_of(self.c)
        self.alive = ctx.template_alive
        self.ct = max(ctx.compute_t, ctx.now)
        self.nb, self.dec = ctx.floor_arrays()
        # a shard whose floor is a reuse rung takes no request: no round trip (and no bytes, no decode)
        self.rtts = np.where(ctx.floor_reuses(), 0.0, ctx.queued_rtt_s)
        known = ctx.known_ready_array()  # (N,) decoded-at or predicted ready time; nan = not requested
        # a twins'-track floor costs the open-loop floor's bytes off the track: the layers off it at the current
        # step (their reference computed, or held at another level) and, in a plan, those it computes (finish())
        self.nb_off = ctx.floor_off_track_bytes()
        self.off0 = ctx.off_track(self.cs, ~np.isnan(known)) if (self.per_step and track) else None
        # re-roots (sakura's plans under the long-edit rule, where the runtime fetches them: Context.reroots): a
        # layer off its track comes back on it by its chain from the last step requested (:mod:`.reroot`)
        self.req0 = ~np.isnan(known) if (self.off0 is not None and rate is not None and ctx.reroots) else None
        known[: self.c] = np.nan
        prog = ctx.link_progress()
        if prog is not None and rate is not None:  # in-flight shards: no sooner than the link's progress allows
            pending = [g for g in ctx.pending_shards() if g >= self.c]
            t = ctx.now + max(prog[2] - prog[1], 0.0) / rate
            for i, g in enumerate(pending):
                t = t if i == 0 else t + ctx.queued_rtt_s + self.nb[g] / rate
                known[g] = max(known[g], t + self.dec[g])
        self.known = known
        # the compute lane's cost of a fetched layer: cached, plus its shard's decode share when the DiT shares the CPU
        self.cf = self.C + self.share * np.where(np.isnan(known), self.dec, 0.0)
        # requests leave back to back from link0, each paying its queued round trip (rtts): none with requests sent
        # ahead, but the chain's first requests may still pay theirs (lead_rtts; exact transfer times only)
        self.link0 = max(ctx.now, ctx.link_busy_until())
        self.lead_rtts = lead_rtts(ctx)
        self.nl = ctx.decided_upto if fetch_from is None else fetch_from
        self.layer = np.arange(self.N) % self.L
        self.step = np.arange(self.N) // self.L if self.per_step else np.zeros(self.N, dtype=int)
        self._ksuf: np.ndarray | None = None
        self._last_need: tuple[tuple, np.ndarray] | None = None  # _need's last plan and its answer
        self._sums: np.ndarray | None = None  # step_sums of nb for _rerooted_bytes (nb is fixed)
        self._chain = ExactChain(ctx, self.link0)  # exact transfer times (rate None): the last chain's ends reused

    def lows(self) -> list[int]:
        """Smallest split each plan step may take (the current step cannot undo layers already run)."""
        lo = [0] * (self.S - self.cs)
        lo[0] = self.l0
        return lo

    def _need(self, splits) -> np.ndarray:
        """(N,) bool: shards the plan ``splits`` fetches (from the compute position on); the last plan's kept (a
        finish asks twice: for the lane and for the plan's bytes). Read-only."""
        key = tuple(splits)
        if self._last_need is not None and self._last_need[0] == key:
            return self._last_need[1]
        k = np.array(key, dtype=int)
        if not self.alive:
            k[0] = self.l0
        kk = np.concatenate([np.full(self.cs, self.L), k])  # earlier steps: nothing needed
        need = self.layer >= kk[self.step]
        need[: self.c] = False
        self._last_need = (key, need)
        return need

    def pending(self, splits) -> int:
        """Shards the plan ``splits`` still needs that are not requested yet."""
        return int(np.count_nonzero(self._need(splits) & np.isnan(self.known)))

    def finish(
        self, splits, first_nbytes: float | None = None, first_dec: float | None = None, upto_step: int | None = None
    ) -> float:
        """Predicted end of the edit (seconds) with ``splits`` for steps cs.. (the current step's is ignored once
        the template is dropped); ``first_nbytes`` / ``first_dec``: the next undecided shard at another level;
        ``upto_step``: the end of that step instead (no tail)."""
        need = self._need(splits)
        end = self.N if upto_step is None else min(self.N, (upto_step + 1) * self.L if self.per_step else self.N)
        ready = self.known.copy()
        idx = np.nonzero(need & np.isnan(self.known))[0]
        if idx.size:
            nb, d = self._planned_bytes(splits)[idx], self.dec[idx]
            pos = int(np.searchsorted(idx, self.nl))
            if first_nbytes is not None and pos < idx.size and idx[pos] == self.nl:
                nb, d = nb.copy(), d.copy()
                nb[pos] = first_nbytes
                d[pos] = d[pos] if first_dec is None else first_dec
            arrive = self._arrivals(nb, idx)
            dc = np.cumsum(d)
            ready[idx] = dc + np.maximum(np.maximum.accumulate(arrive - (dc - d)), self.link0)
        # the compute lane from the compute position: a template layer costs F and never waits, a fetched one
        # costs C once its shard is ready: the end = max(start + all work, max over fetched (ready + work from it))
        cost = np.where(need[self.c : end], self.cf[self.c : end], self.F)
        work_from = np.cumsum(cost[::-1])[::-1]  # work from each slot to the end
        r = ready[self.c : end][need[self.c : end]] + work_from[need[self.c : end]]
        t = max(self.ct + float(work_from[0]) if work_from.size else self.ct, float(r.max()) if r.size else _NEG)
        return t if upto_step is not None else t + self.tail

    def _planned_bytes(self, splits) -> np.ndarray:
        """(N,) floor bytes under the plan ``splits``: a layer is off its twins' track from the first step that
        computes it on the device on (the track is rooted at step 0 only), and off it already where ``off0`` says;
        there it costs the open-loop floor's bytes (:meth:`Context.floor_off_track_bytes`)."""
        if self.off0 is None or not self.off0.size:
            return self.nb
        if self.req0 is not None:
            return self._rerooted_bytes(splits)
        k = np.array(splits, dtype=int)
        if not self.alive:
            k[0] = self.l0
        # step cs + i's layers are off if off0, or computed at a step cs..cs + i - 1 (below the running max split)
        before = np.concatenate([[0], np.maximum.accumulate(k)[:-1]])  # (steps left,)
        off = self.off0[None, :] | (np.arange(self.L)[None, :] < before[:, None])
        if not off.any():
            return self.nb
        nb = self.nb.copy()
        tail = nb[self.cs * self.L :].reshape(-1, self.L)
        tail[off] = self.nb_off[self.cs * self.L :].reshape(-1, self.L)[off]
        return nb

    def _rerooted_bytes(self, splits) -> np.ndarray:
        """(N,) floor bytes under the plan ``splits`` where off-track layers are re-rooted (``req0`` set): a shard
        whose layer was not requested at the step before costs the cheaper of the open-loop floor and its twin plus
        the chain back to the last step requested (:func:`~sakura_core.policy.reroot.chain_bytes`, the plan's
        fetches counted as requested); a layer at the current step held off the track (another level) the open-loop
        floor."""
        assert self.req0 is not None and self.off0 is not None
        if self._sums is None:
            self._sums = step_sums(self.nb, self.S)
        chain = chain_bytes(self.nb, self.req0 | self._need(splits), self.S, self._sums)
        nb = np.where(chain > 0, np.minimum(self.nb_off, self.nb + chain), self.nb)
        if self.cs > 0:  # off at the current step with its reference requested: held at another level
            held_off = self.off0 & self.req0[(self.cs - 1) * self.L : self.cs * self.L]
            row = slice(self.cs * self.L, (self.cs + 1) * self.L)
            nb[row] = np.where(held_off, self.nb_off[row], nb[row])
        return nb

    def _arrivals(self, nb: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """When the shards ``idx`` (bytes ``nb``), fetched back to back from ``link0``, arrive (a reuse rung: at once)."""
        rtts = self.rtts[idx]
        if self.rate is not None:
            return self.link0 + np.cumsum(rtts + nb / self.rate)
        sent = ~((rtts == 0) & (nb == 0))  # a reuse rung: no request, it is there at once
        gaps = rtts[sent].astype(float)
        lead = np.asarray(self.lead_rtts[: gaps.size], dtype=float)
        gaps[: lead.size] += lead  # the chain's first requests may still pay their round trips
        ends = self._chain.ends(gaps, nb[sent])
        out = np.full(nb.size, self.link0)
        out[sent] = ends
        return np.maximum.accumulate(out)  # a reuse rung: when the request before it ended (ends never decrease)

    def cut_table(self, k0s) -> list[tuple[np.ndarray, np.ndarray]]:
        """The best cut plan for each current-step split in ``k0s`` (constant rate only), for both cut families
        (``use_known`` False, True): (cut index, finish) per split. A cut ``i`` runs the later steps' layers on the
        device from the next step's start ``e0`` to ``e0 + i`` and fetches every later shard from there; with
        ``use_known``, a step on the device still uses the shards at the end of it that are decoded or on their way
        (its split is where they start). The finish of every cut at once is a few running maxima (the module
        docstring): O(shards) numpy work per split."""
        L, N, F = self.L, self.N, self.F
        e0 = min((self.cs + 1) * L, N) if self.per_step else N
        unk = np.isnan(self.known)
        wf = np.concatenate([np.cumsum(self.cf[::-1])[::-1], [0.0]])  # wf[g]: fetched work from g to the end
        tau = np.where(unk, self.rtts + self.nb / self.rate, 0.0)
        dd = np.where(unk, self.dec, 0.0)
        U = np.concatenate([[0.0], np.cumsum(tau)])  # U[g]: link time of the unknown shards before g
        Dc = np.concatenate([[0.0], np.cumsum(dd)])
        pre = self._current_steps(k0s, e0, unk, U, Dc, dd)
        t_pre, r_pre, u_pre = pre[:, :1], pre[:, 1:2], pre[:, 2:3]  # (splits, 1) each
        g, P = np.arange(e0, N), np.arange(e0, N + 1)
        ug = unk[g]
        sm = _suffix_max(np.where(ug, Dc[g + 1] + wf[g], _NEG))  # decode-bound, from each g on
        sv = _suffix_max(np.where(ug, U[g + 1] - Dc[g] + sm[:-1], _NEG))  # link-bound
        sk = _suffix_max(np.where(ug, _NEG, self.known[g] + wf[g]))  # shards already on their way
        # the terms that do not depend on the cut family: (splits, cuts)
        shared = np.maximum(r_pre + (sm - Dc[P]), u_pre + (self.link0 - U[P] + sv))
        out = []
        for use_known in (False, True):
            ks = self.known_suffix()[e0:] if use_known else np.zeros(g.size, dtype=bool)
            cb = np.concatenate([[0.0], np.cumsum(np.where(ks, self.cf[e0:], F))])  # device work on [e0, P)
            after = cb + wf[P]  # work from the next step's start to the end
            rest = sk
            if use_known:  # the known suffixes of steps on the device: their shards are used
                pk = np.concatenate([[_NEG], np.maximum.accumulate(np.where(ks, self.known[g] - cb[:-1], _NEG))])
                rest = np.maximum(sk, pk + after)
            t = np.maximum(np.maximum(t_pre + after, rest), shared)
            best = np.argmin(t, axis=1)
            out.append((best, t[np.arange(len(pre)), best] + self.tail))
        return out

    def known_suffix(self) -> np.ndarray:
        """(N,) bool: shards decoded or on their way whose later layers in the same step all are too."""
        if self._ksuf is None:
            k = (~np.isnan(self.known)).reshape(self.S, self.N // self.S)[:, ::-1]
            self._ksuf = np.logical_and.accumulate(k, axis=1)[:, ::-1].reshape(-1)
        return self._ksuf

    def _current_steps(self, k0s, e0: int, unk, U, Dc, dd) -> np.ndarray:
        """(splits, 3): for each current-step split k0 (the template on [c, a), shards on [a, e0), a = step start +
        k0): when the step's compute ends, when the decoder is free after its shards, their link time (seconds).
        One (splits x layers) array: the current step has at most L slots."""
        F, c = self.F, self.c
        wf = np.concatenate([np.cumsum(self.cf[c:e0][::-1])[::-1], [0.0]])  # fetched work from each slot to e0
        a = np.maximum(self.cs * self.L + np.asarray(k0s, dtype=int), c)[:, None]  # (splits, 1)
        g = np.arange(c, e0)[None, :]  # (1, slots)
        fetched = g >= a
        uk = fetched & unk[g]
        arr = self.link0 + U[g + 1] - U[a]
        dc = np.where(uk, Dc[g + 1] - Dc[a], 0.0)
        lane = np.maximum.accumulate(np.where(uk, arr - (dc - dd[g]), _NEG), axis=1)
        ru = np.where(uk, dc + np.maximum(lane, self.link0), _NEG)
        ready = np.where(uk, ru, np.where(fetched, self.known[g], _NEG))
        wait = np.max(ready + wf[:-1], axis=1, initial=_NEG) if g.size else np.full(a.shape[0], _NEG)
        t_pre = np.maximum(self.ct + (a[:, 0] - c) * F + wf[a[:, 0] - c], wait)
        r_pre = np.maximum(np.max(ru, axis=1, initial=_NEG) if g.size else _NEG, self.link0)
        return np.stack([t_pre, r_pre, U[e0] - U[a[:, 0]]], axis=1)

    def cut_splits(self, k0: int, i: int, use_known: bool = False) -> tuple[int, ...]:
        """The split vector of the current-step split ``k0`` and cut ``i`` (see :meth:`cut_table`)."""
        L = self.L
        ks = self.known_suffix().reshape(self.S, -1) if use_known else None
        out = [k0 if self.alive else self.l0]
        for s in range(self.cs + 1, self.S):
            k = min(max(L * (self.cs + 1) + i - s * L, 0), L)
            if ks is not None and ks[s].any():
                k = min(k, int(ks[s].argmax()))  # where the step's known suffix starts
            out.append(k)
        return tuple(out)


def best_plan(snap: Snapshot, init: tuple[int, ...] | None = None, rounds: int = 2) -> Plan:
    """The split vector with the earliest predicted finish: the best cut plan (every current-step split, every cut
    of the later steps, with and without the shards already on their way) or ``init`` (the previous plan, which
    wins ties). With exact transfer times (``rate=None``: the oracle's one search per edit) the cuts and the uniform
    splits are evaluated exactly, and the best uniform split and the best cut are each refined by coordinate
    descent over every step's split."""
    n, L = snap.S - snap.cs, snap.L
    lo = snap.lows()
    k0s = list(range(lo[0], L + 1)) if snap.alive else [snap.l0]
    if snap.rate is not None:  # the cut plans' finishes come from the closed form (equal to finish(): tested)
        best: tuple[int, ...] | None = None
        best_t = float("inf")
        if init is not None and len(init) == n:
            best = tuple(max(lo[i], min(L, int(x))) for i, x in enumerate(init))
            best_t = snap.finish(best)
        scored: list[tuple[tuple[int, ...], float]] = []
        for use_known, (cuts, finishes) in zip((False, True), snap.cut_table(k0s), strict=True):
            j = int(np.argmin(finishes))
            scored.append((snap.cut_splits(k0s[j], int(cuts[j]), use_known), float(finishes[j])))
        if snap.track and snap.per_step:  # the cuts priced on the track: their exact finish, then the held splits
            scored = [(v, snap.finish(v)) for v, _ in scored] + [(v, snap.finish(v)) for v in _held(snap, lo)]
        for v, t in scored:
            if best is None or t < best_t - 1e-12:  # every finish infinite: still a plan (the first candidate)
                best, best_t = v, t
        if best is None:
            raise ValueError(f"no plan for step {snap.cs}: the cut table is empty (current-step splits {k0s})")
        return Plan(snap.cs, best, best_t)
    cands = [tuple(max(lo[i], k) for i in range(n)) for k in range(L + 1)]
    if init is not None and len(init) == n:
        cands.insert(0, tuple(max(lo[i], min(L, int(x))) for i, x in enumerate(init)))
    best, best_t = _best_of(snap, cands)
    if n == 1 and snap.alive:
        return Plan(snap.cs, best, best_t)
    best, best_t = _descend(snap, best, best_t, lo, rounds)
    m = (n - 1) * L
    cut, cut_t = _best_of(snap, [snap.cut_splits(k0, i) for k0 in (lo[0], L) for i in range(m + 1)])
    cut, cut_t = _descend(snap, cut, cut_t, lo, rounds)
    return Plan(snap.cs, *((cut, cut_t) if cut_t < best_t - 1e-12 else (best, best_t)))


def _held(snap: Snapshot, lo: list[int]) -> list[tuple[int, ...]]:
    """The held-split family: one split ``k`` for every remaining step (the current step's no lower than it can be),
    ``k`` = 0..L: the oracle's plan on a twins'-track floor (layers >= k stay on their track all edit)."""
    n, k0 = snap.S - snap.cs, lo[0] if snap.alive else snap.l0
    return [(max(k, k0) if snap.alive else k0,) + (k,) * (n - 1) for k in range(snap.L + 1)]


def _best_of(snap: Snapshot, cands: list[tuple[int, ...]]) -> tuple[tuple[int, ...], float]:
    """The first candidate with the earliest :meth:`Snapshot.finish` (repeats evaluated once)."""
    best, best_t = cands[0], float("inf")  # every finish infinite: the first candidate
    for v in dict.fromkeys(cands):
        t = snap.finish(v)
        if t < best_t - 1e-12:
            best, best_t = v, t
    return best, best_t


def _descend(snap: Snapshot, best: tuple, best_t: float, lo: list[int], rounds: int) -> tuple[tuple, float]:
    """Coordinate descent over each step's split (the oracle's refinement; O(steps x layers) evaluations)."""
    n, L = len(best), snap.L
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
    return best, best_t
