// Receding-horizon plan over the remaining (step, layer) shards, as sakura_core/policy/planner.py, for an estimated
// rate (the page has no trace: the oracle's exact-transfer search is not ported). A plan is one template split per
// remaining step; Snapshot freezes what is known now and predicts the edit's finish for a split vector; bestPlan is
// the best "cut" plan (closed form, cutTable) or the previous plan, which wins ties. Same float operations, in the
// same order, as the numpy code (cumulative sums left to right, running maxima).
import { argmin, pyMax } from "./pyfloat.js";
import { chainBytes } from "./reroot.js";

const NEG = -Infinity;
// the long-edit rule (TRACK_RATIO in planner.py): price the twins' track where the open-loop floor costs more
export const TRACK_RATIO = 4.0;

/** Per-step KV on a twins'-track floor whose open-loop floor costs more than TRACK_RATIO times the twins (summed
 *  over the shards with a twin, in shard order): plans are priced on the track (Snapshot's `track`). */
export function trackPriced(ctx) {
  if (!ctx.perStep) return false;
  const nb = ctx.floorArrays()[0];
  const off = ctx.floorOffTrackBytes();
  let sumOff = 0;
  let sumNb = 0;
  let any = false;
  for (let g = 0; g < nb.length; g++) {
    if (off[g] === nb[g]) continue;
    any = true;
    sumOff += off[g];
    sumNb += nb[g];
  }
  return any && sumOff > TRACK_RATIO * sumNb;
}

export class Plan {
  constructor(firstStep, splits, finishS) {
    this.firstStep = firstStep;
    this.splits = splits;
    this.finishS = finishS;
    Object.freeze(this);
  }

  split(step) {
    return this.splits[step - this.firstStep];
  }
}

/** out[i] = max(x[i:]) (-inf past the end: one extra element). */
function suffixMax(x) {
  const out = new Float64Array(x.length + 1).fill(NEG);
  let m = NEG;
  for (let i = x.length - 1; i >= 0; i--) {
    m = Math.max(m, x[i]);
    out[i] = m;
  }
  return out;
}

/** Sums from each index to the end (numpy's cumsum of the reversed array, reversed), then `extra` zeros. */
function sumsFrom(x, lo, hi, extra = 0) {
  const out = new Float64Array(hi - lo + extra);
  let s = 0;
  for (let i = hi - 1; i >= lo; i--) {
    s += x[i];
    out[i - lo] = s;
  }
  return out;
}

export class Snapshot {
  constructor(ctx, rate, fetchFrom = null, track = false) {
    if (rate === null) throw new RangeError("the page plans on an estimated rate; exact transfer times need a trace");
    const p = ctx.profile;
    this.ctx = ctx;
    this.rate = rate;
    this.track = track;
    this.L = ctx.layersPerStep;
    this.N = ctx.numLayers;
    this.perStep = ctx.perStep;
    this.S = this.perStep ? ctx.steps : 1;
    this.F = p.layerFullS;
    this.C = p.layerCachedS;
    const cores = Math.trunc(p.ditCpuCores || 0);
    this.share = cores ? 1.0 / cores : 0.0;
    this.tail = p.fixedS + (this.perStep ? 0.0 : (p.steps - 1) * this.L * p.layerCachedS);
    this.c = ctx.computeLayer;
    this.cs = ctx.stepOf(this.c);
    this.l0 = ctx.layerOf(this.c);
    this.alive = ctx.templateAlive;
    this.ct = pyMax(ctx.computeT, ctx.now);
    [this.nb, this.dec] = ctx.floorArrays();
    const reuse = ctx.floorReuses();
    const q = ctx.queuedRttS;
    this.rtts = Float64Array.from(reuse, (r) => (r ? 0.0 : q));
    const known = ctx.knownReadyArray();
    // off the twins' track a shard costs the open-loop floor's bytes: the layers off it now, and those a plan computes
    this.nbOff = ctx.floorOffTrackBytes();
    this.off0 = this.perStep && track ? ctx.offTrack(this.cs, Array.from(known, (k) => !Number.isNaN(k))) : null;
    // re-roots where the runtime fetches them (ctx.reroots): a layer off its track comes back by its chain (reroot.js)
    this.req0 = this.off0 !== null && ctx.reroots ? Array.from(known, (k) => !Number.isNaN(k)) : null;
    known.fill(NaN, 0, this.c);
    const prog = ctx.linkProgress();
    if (prog !== null) {
      const pending = ctx.pendingShards().filter((g) => g >= this.c);
      let t = ctx.now + pyMax(prog[2] - prog[1], 0.0) / rate;
      pending.forEach((g, i) => {
        t = i === 0 ? t : t + ctx.queuedRttS + this.nb[g] / rate;
        known[g] = pyMax(known[g], t + this.dec[g]);
      });
    }
    this.known = known;
    this.cf = Float64Array.from(known, (k, g) => this.C + this.share * (Number.isNaN(k) ? this.dec[g] : 0.0));
    this.link0 = pyMax(ctx.now, ctx.linkBusyUntil());
    this.nl = fetchFrom === null ? ctx.decidedUpto : fetchFrom;
    this._ksuf = null;
  }

  stepOfShard(g) {
    return this.perStep ? Math.floor(g / this.L) : 0;
  }

  /** Smallest split each plan step may take. */
  lows() {
    const lo = new Array(this.S - this.cs).fill(0);
    lo[0] = this.l0;
    return lo;
  }

  /** Shards the plan `splits` fetches (from the compute position on). */
  _need(splits) {
    const k = splits.slice();
    if (!this.alive) k[0] = this.l0;
    const need = new Array(this.N).fill(false);
    for (let g = this.c; g < this.N; g++) {
      const s = this.stepOfShard(g);
      const kk = s < this.cs ? this.L : k[s - this.cs];
      need[g] = g % this.L >= kk;
    }
    return need;
  }

  /** Shards the plan still needs that are not requested yet. */
  pending(splits) {
    const need = this._need(splits);
    let n = 0;
    for (let g = 0; g < this.N; g++) if (need[g] && Number.isNaN(this.known[g])) n++;
    return n;
  }

  /** Predicted end of the edit (seconds) with `splits`; firstNbytes/firstDec: the next undecided shard at another
   *  level; uptoStep: the end of that step instead (no tail). */
  finish(splits, firstNbytes = null, firstDec = null, uptoStep = null) {
    const need = this._need(splits);
    const N = this.N;
    const end = uptoStep === null ? N : Math.min(N, this.perStep ? (uptoStep + 1) * this.L : N);
    const ready = Float64Array.from(this.known);
    const idx = [];
    for (let g = 0; g < N; g++) if (need[g] && Number.isNaN(this.known[g])) idx.push(g);
    if (idx.length) {
      const nbs = this._plannedBytes(splits);
      let arriveSum = 0;
      let dc = 0;
      let lane = NEG;
      for (let i = 0; i < idx.length; i++) {
        const g = idx[i];
        let nb = nbs[g];
        let d = this.dec[g];
        if (firstNbytes !== null && g === this.nl) {
          nb = firstNbytes;
          d = firstDec === null ? d : firstDec;
        }
        arriveSum += this.rtts[g] + nb / this.rate;
        const arrive = this.link0 + arriveSum;
        dc += d;
        lane = Math.max(lane, arrive - (dc - d));
        ready[g] = dc + Math.max(lane, this.link0);
      }
    }
    const c = this.c;
    const workFrom = new Float64Array(Math.max(end - c, 0));
    let s = 0;
    for (let g = end - 1; g >= c; g--) {
      s += need[g] ? this.cf[g] : this.F;
      workFrom[g - c] = s;
    }
    let rMax = null;
    for (let g = c; g < end; g++) {
      if (!need[g]) continue;
      const r = ready[g] + workFrom[g - c];
      rMax = rMax === null ? r : Math.max(rMax, r);
    }
    const t = pyMax(workFrom.length ? this.ct + workFrom[0] : this.ct, rMax === null ? NEG : rMax);
    return uptoStep !== null ? t : t + this.tail;
  }

  /** Floor bytes under the plan `splits`: a layer is off its twins' track (the open-loop floor's bytes) from the
   *  step after the first one that computes it on, and where off0 says. */
  _plannedBytes(splits) {
    if (this.off0 === null) return this.nb;
    if (this.req0 !== null) return this._rerootedBytes(splits);
    const L = this.L;
    const k = splits.slice();
    if (!this.alive) k[0] = this.l0;
    let nb = null;
    let before = 0; // the highest split of the plan's earlier steps
    for (let i = 0; i < k.length; i++) {
      for (let l = 0; l < L; l++) {
        if (!(this.off0[l] || l < before)) continue;
        if (nb === null) nb = Float64Array.from(this.nb);
        const g = (this.cs + i) * L + l;
        nb[g] = this.nbOff[g];
      }
      before = Math.max(before, k[i]);
    }
    return nb === null ? this.nb : nb;
  }

  /** Floor bytes under the plan `splits` with off-track layers re-rooted (planner.py _rerooted_bytes): the cheaper
   *  of the open-loop floor and the twin plus its chain; a current-step layer held at another level: open-loop. */
  _rerootedBytes(splits) {
    const need = this._need(splits);
    const req = this.req0.map((r, g) => r || need[g]);
    const chain = chainBytes(this.nb, req, this.S);
    const nb = Float64Array.from(this.nb, (x, g) => (chain[g] > 0 ? Math.min(this.nbOff[g], x + chain[g]) : x));
    if (this.cs > 0) {
      const L = this.L;
      for (let l = 0; l < L; l++) {
        if (this.off0[l] && this.req0[(this.cs - 1) * L + l]) nb[this.cs * L + l] = this.nbOff[this.cs * L + l];
      }
    }
    return nb;
  }

  /** The best cut plan for each current-step split in k0s, for both cut families: [[cuts, finishes], ...]. */
  cutTable(k0s) {
    const { L, N, F } = this;
    const e0 = this.perStep ? Math.min((this.cs + 1) * L, N) : N;
    const unk = Array.from(this.known, Number.isNaN);
    const wf = sumsFrom(this.cf, 0, N, 1);
    const U = new Float64Array(N + 1);
    const Dc = new Float64Array(N + 1);
    const dd = new Float64Array(N);
    for (let g = 0; g < N; g++) {
      const tau = unk[g] ? this.rtts[g] + this.nb[g] / this.rate : 0.0;
      dd[g] = unk[g] ? this.dec[g] : 0.0;
      U[g + 1] = U[g] + tau;
      Dc[g + 1] = Dc[g] + dd[g];
    }
    const pre = this._currentSteps(k0s, e0, unk, U, Dc, dd);
    const n = N - e0;
    const smIn = new Float64Array(n);
    const skIn = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      const g = e0 + i;
      smIn[i] = unk[g] ? Dc[g + 1] + wf[g] : NEG;
      skIn[i] = unk[g] ? NEG : this.known[g] + wf[g];
    }
    const sm = suffixMax(smIn);
    const svIn = new Float64Array(n);
    for (let i = 0; i < n; i++) svIn[i] = unk[e0 + i] ? U[e0 + i + 1] - Dc[e0 + i] + sm[i] : NEG;
    const sv = suffixMax(svIn);
    const sk = suffixMax(skIn);
    const ksAll = this.knownSuffix();
    const out = [];
    for (const useKnown of [false, true]) {
      const cb = new Float64Array(n + 1);
      for (let i = 0; i < n; i++) cb[i + 1] = cb[i] + (useKnown && ksAll[e0 + i] ? this.cf[e0 + i] : F);
      const after = Float64Array.from(cb, (x, i) => x + wf[e0 + i]);
      let rest = sk;
      if (useKnown) {
        const pk = new Float64Array(n + 1).fill(NEG);
        let m = NEG;
        for (let i = 0; i < n; i++) {
          m = Math.max(m, ksAll[e0 + i] ? this.known[e0 + i] - cb[i] : NEG);
          pk[i + 1] = m;
        }
        rest = Float64Array.from(sk, (x, i) => Math.max(x, pk[i] + after[i]));
      }
      const cuts = [];
      const finishes = [];
      for (const [tPre, rPre, uPre] of pre) {
        const row = new Float64Array(n + 1);
        for (let i = 0; i <= n; i++) {
          const P = e0 + i;
          const shared = Math.max(rPre + (sm[i] - Dc[P]), uPre + (this.link0 - U[P] + sv[i]));
          row[i] = Math.max(Math.max(tPre + after[i], rest[i]), shared);
        }
        const best = argmin(row);
        cuts.push(best);
        finishes.push(row[best] + this.tail);
      }
      out.push([cuts, finishes]);
    }
    return out;
  }

  /** Shards decoded or on their way whose later layers in the same step all are too. */
  knownSuffix() {
    if (this._ksuf === null) {
      const per = this.N / this.S;
      const out = new Array(this.N).fill(false);
      for (let s = 0; s < this.S; s++) {
        let all = true;
        for (let j = per - 1; j >= 0; j--) {
          all = all && !Number.isNaN(this.known[s * per + j]);
          out[s * per + j] = all;
        }
      }
      this._ksuf = out;
    }
    return this._ksuf;
  }

  /** For each current-step split k0: [when the step's compute ends, when the decoder is free after its shards,
   *  their link time]. */
  _currentSteps(k0s, e0, unk, U, Dc, dd) {
    const { F, c } = this;
    const wf = sumsFrom(this.cf, c, e0, 1);
    return k0s.map((k0) => {
      const a = Math.max(this.cs * this.L + k0, c);
      let lane = NEG;
      let wait = NEG;
      let ruMax = NEG;
      for (let g = c; g < e0; g++) {
        const fetched = g >= a;
        const uk = fetched && unk[g];
        let ready = NEG;
        if (uk) {
          const arr = this.link0 + U[g + 1] - U[a];
          const dc = Dc[g + 1] - Dc[a];
          lane = Math.max(lane, arr - (dc - dd[g]));
          ready = dc + Math.max(lane, this.link0);
          ruMax = Math.max(ruMax, ready);
        } else if (fetched) {
          ready = this.known[g];
        }
        wait = Math.max(wait, ready + wf[g - c]);
      }
      const tPre = Math.max(this.ct + (a - c) * F + wf[a - c], wait);
      const rPre = Math.max(ruMax, this.link0);
      return [tPre, rPre, U[e0] - U[a]];
    });
  }

  /** The split vector of current-step split k0 and cut i. */
  cutSplits(k0, i, useKnown = false) {
    const L = this.L;
    const ks = useKnown ? this.knownSuffix() : null;
    const out = [this.alive ? k0 : this.l0];
    for (let s = this.cs + 1; s < this.S; s++) {
      let k = Math.min(Math.max(L * (this.cs + 1) + i - s * L, 0), L);
      if (ks !== null) {
        const first = ks.slice(s * L, (s + 1) * L).indexOf(true);
        if (first >= 0) k = Math.min(k, first);
      }
      out.push(k);
    }
    return out;
  }
}

/** The split vector with the earliest predicted finish: the best cut plan, or `init` (which wins ties). */
export function bestPlan(snap, init = null) {
  const n = snap.S - snap.cs;
  const L = snap.L;
  const lo = snap.lows();
  const k0s = [];
  if (snap.alive) for (let k = lo[0]; k <= L; k++) k0s.push(k);
  else k0s.push(snap.l0);
  let best = null;
  let bestT = Infinity;
  if (init !== null && init.length === n) {
    best = init.map((x, i) => Math.max(lo[i], Math.min(L, Math.trunc(x))));
    bestT = snap.finish(best);
  }
  const table = snap.cutTable(k0s);
  let cands = [false, true].map((useKnown, f) => {
    const [cuts, finishes] = table[f];
    const j = argmin(finishes);
    return [snap.cutSplits(k0s[j], cuts[j], useKnown), finishes[j]];
  });
  if (snap.track && snap.perStep) {
    // the cuts priced on the track: their exact finish, then the held splits
    cands = cands.map(([v]) => [v, snap.finish(v)]).concat(held(snap, lo).map((v) => [v, snap.finish(v)]));
  }
  for (const [v, t] of cands) {
    if (t < bestT - 1e-12) {
      best = v;
      bestT = t;
    }
  }
  return new Plan(snap.cs, best, bestT);
}

/** The held-split family: one split k for every remaining step (the current step's no lower than it can be). */
function held(snap, lo) {
  const n = snap.S - snap.cs;
  const k0 = snap.alive ? lo[0] : snap.l0;
  const out = [];
  for (let k = 0; k <= snap.L; k++) {
    const v = new Array(n).fill(k);
    v[0] = snap.alive ? Math.max(k, k0) : k0;
    out.push(v);
  }
  return out;
}
