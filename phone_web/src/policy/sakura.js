// The `sakura` policy, as sakura_core/policy/sakura.py: a receding-horizon plan over the remaining (step, layer)
// shards (planner.js) under the harmonic-mean estimate; a bandwidth probe before the first sample; shards below their
// step's planned split deferred (a step two or more steps ahead fetches its planned layers last first); the quality floor (or the highest level under a latency target); the template
// dropped only when the plan at the slowest recent rate drops there and the drop survives an outage; a late shard
// raced against a resumed template pass (patience, the edit's waiting allowance, ski rental); progressive upgrades
// on an idle link. Same decisions and reasons as Python (tests/phone_web/test_policy_conformance.py).
import { Decision, LEVEL_COMPUTE, Policy } from "./base.js";
import { expectedNbytes, feedsTwin } from "./ladder.js";
import { bestPlan, Snapshot, trackPriced } from "./planner.js";
import { chainOf } from "./reroot.js";
import { fixed, pyMax, pyMin } from "./pyfloat.js";

export class Sakura extends Policy {
  static policyName = "sakura";
  static planEstimate = "harmonic";
  static regretSlowdown = 1.0;
  static latePatience = 0.25;
  static stallBudget = 0.015;
  static lateMargin = 0.5;
  static laterFirstFrom = 2;

  constructor() {
    super();
    // the rule constants (sakura.py's class attributes), per instance as there
    this.planEstimate = Sakura.planEstimate;
    this.regretSlowdown = Sakura.regretSlowdown;
    this.latePatience = Sakura.latePatience;
    this.stallBudget = Sakura.stallBudget;
    this.lateMargin = Sakura.lateMargin;
    this.laterFirstFrom = Sakura.laterFirstFrom;
  }

  reset() {
    this._plan = null;
    this._lateSince = new Map();
    this._lastProgress = null; // [now, bytes received, requested at, rate since the ask before]
    this._cache = null;
    this._whyCache = null;
  }

  rate(ctx) {
    const est = this.planEstimate === "harmonic" ? ctx.estimator.harmonic() : ctx.estimator.robust();
    return ctx.slowed(est);
  }

  dropRate(ctx) {
    return ctx.slowed(ctx.estimator.worst());
  }

  /** The planner's snapshot at `rate`, priced on the twins' track where the long-edit rule holds (trackPriced). */
  snapshot(ctx, rate, fetchFrom = null) {
    return new Snapshot(ctx, rate, fetchFrom, trackPriced(ctx));
  }

  /** The plan and its snapshot for this moment (reused while the moment is the same). */
  _replan(ctx, rate) {
    const key = [ctx.now, ctx.computeLayer, ctx.templateAlive, rate, ctx.decidedUpto, ctx.linkBusyUntil()];
    if (this._cache !== null && this._cache[0].every((x, i) => x === key[i])) return [this._cache[1], this._cache[2]];
    const snap = this.snapshot(ctx, rate);
    let init = null;
    const prev = this._plan;
    if (prev !== null && prev.firstStep <= snap.cs && snap.cs < prev.firstStep + prev.splits.length) {
      init = prev.splits.slice(snap.cs - prev.firstStep);
    }
    const plan = bestPlan(snap, init);
    this._plan = plan;
    this._cache = [key, plan, snap];
    this._whyCache = null;
    return [plan, snap];
  }

  /** The plan in words (runs of steps with the same split said once). */
  _why(ctx, plan, rate) {
    const c = this._whyCache;
    if (c !== null && c[0] === plan && c[1] === rate) return c[2];
    const L = ctx.layersPerStep;
    const parts = [];
    let i = 0;
    while (i < plan.splits.length) {
      const k = plan.splits[i];
      let j = i;
      while (j + 1 < plan.splits.length && plan.splits[j + 1] === k) j++;
      const what = k < L ? `split at layer ${k}` : "no split: the device computes all";
      const first = plan.firstStep + i;
      const last = plan.firstStep + j;
      const steps = i === j ? `step ${first}` : `steps ${first}-${last}`;
      parts.push(ctx.perStep ? `${steps} ${what}` : what);
      i = j + 1;
    }
    const why = `plan: ${parts.join("; ")}; predicted finish t=${fixed(plan.finishS, 2)} s at ${ctx.fmtRate(rate)}`;
    this._whyCache = [plan, rate, why];
    return why;
  }

  worthAsking(ctx, shards) {
    const rate = this.rate(ctx);
    if (ctx.estimator.samples === 0) return shards;
    const [plan, snap] = this._replan(ctx, rate);
    return shards.filter((g) => {
      const step = snap.stepOfShard(g);
      let k = plan.splits[step - plan.firstStep];
      if (!ctx.templateAlive && step === snap.cs) k = snap.l0;
      return (g < ctx.computeLayer || g % snap.L >= k) && !this._laterFirst(ctx, snap, plan, g);
    });
  }

  /** Under the long-edit rule, where the runtime fetches re-roots: the chain that puts shard `layer`'s layer back on
   *  its twins' track (reroot.js chainOf; sakura.py reroot_chain). */
  rerootChain(ctx, layer) {
    if (!ctx.reroots || !trackPriced(ctx)) return [];
    return chainOf(ctx, layer, Array.from(ctx.knownReadyArray(), (k) => !Number.isNaN(k)));
  }

  /** Per-step KV: a shard at or above its step's planned split, its step laterFirstFrom or more steps ahead of the
   * compute lane, waits while a later layer of its step with bytes is not requested yet (sakura.py _later_first). */
  _laterFirst(ctx, snap, plan, layer) {
    const step = ctx.stepOf(layer);
    if (!ctx.perStep || step < snap.cs + this.laterFirstFrom || layer < ctx.computeLayer) return false;
    if (ctx.layerOf(layer) < plan.split(step)) return false;
    const end = (step + 1) * ctx.layersPerStep;
    const reuse = ctx.floorReuses();
    for (let g = layer + 1; g < end; g++) if (Number.isNaN(snap.known[g]) && !reuse[g]) return true;
    return false;
  }

  choose(ctx, layer) {
    const rate = this.rate(ctx);
    const ladder = ctx.ladder(layer);
    if (ctx.estimator.samples === 0) {
      if (probeSkips(ctx, layer)) {
        return new Decision(LEVEL_COMPUTE, `step ${ctx.stepOf(layer)} layer ${ctx.layerOf(layer)} waits for the bandwidth probe (a shard of the next step: this step's cannot beat the compute lane without a sample)`, { defer: true });
      }
      const fl = ctx.floorOf(layer);
      return new Decision(fl, `bandwidth probe (no throughput sample yet): floor level ${ladder[fl].name}`);
    }
    if (layer < ctx.computeLayer) return new Decision(LEVEL_COMPUTE, `compute is already past shard ${layer}`);
    const [plan, snap] = this._replan(ctx, rate);
    const step = ctx.stepOf(layer);
    const lay = ctx.layerOf(layer);
    const k = step > snap.cs || ctx.templateAlive ? plan.split(step) : snap.l0;
    const why = this._why(ctx, plan, rate);
    if (lay < k) {
      return new Decision(LEVEL_COMPUTE, `device computes step ${step} layer ${lay} for now, asked again until the compute lane reaches it (${why})`, { defer: true });
    }
    if (this._laterFirst(ctx, snap, plan, layer)) {
      return new Decision(LEVEL_COMPUTE, `later layers of step ${step} first: layer ${lay} waits until the step's later planned layers are requested (the step is ${step - snap.cs} steps ahead; ${why})`, { defer: true });
    }
    const best = this._levelUnderTarget(ctx, layer, plan, rate);
    if (best === ctx.floorOf(layer)) {
      return new Decision(best, `step ${step} layer ${lay}: level ${ladder[best].name} (the quality floor; idle link time refines it later); ${why}`);
    }
    const slack = `slack under the ${fixed(ctx.latencyTargetS, 2)} s target`;
    return new Decision(best, `step ${step} layer ${lay}: level ${ladder[best].name} (${slack}); ${why}`);
  }

  /** The highest level that keeps the predicted finish under the latency target (the floor without one). */
  _levelUnderTarget(ctx, layer, plan, rate) {
    const target = ctx.latencyTargetS;
    if (target === null || target <= plan.finishS) return ctx.floorOf(layer);
    const snap = this.snapshot(ctx, rate, layer);
    const worst = this.dropRate(ctx);
    const slow = worst !== rate ? this.snapshot(ctx, worst, layer) : null;
    const ladder = ctx.ladder(layer);
    const allowed = ctx.levelsFromFloor(layer);
    let best = allowed[0];
    for (const idx of allowed.slice(1)) {
      const lv = ladder[idx];
      if (snap.finish(plan.splits, expectedNbytes(lv), lv.decodeS) > target) break;
      if (slow !== null && slow.finish(plan.splits, expectedNbytes(lv), lv.decodeS) > target) break;
      best = idx;
    }
    return best;
  }

  keepTemplate(ctx, layer) {
    return this.keepTemplateRule(ctx, layer) !== "drop";
  }

  /** keepTemplate's answer with the rule that gave it: "cannot-pay", "plan-keeps", "regret", "outage" (keep) or
   *  "drop". */
  keepTemplateRule(ctx, layer) {
    const rate = this.dropRate(ctx);
    if (dropCannotPay(ctx, layer, rate)) return "cannot-pay";
    const [plan, snap] = this._replan(ctx, rate);
    if (plan.splits[0] !== ctx.layerOf(layer)) return "plan-keeps";
    const p = ctx.profile;
    const left = ctx.layersPerStep - snap.l0;
    const keepAll = snap.ct + left * p.layerFullS;
    const dropEnd = snap.finish(plan.splits, null, null, snap.cs);
    if (this.snapshot(ctx, rate / this.regretSlowdown).finish(plan.splits, null, null, snap.cs) > keepAll) return "regret";
    const reuse = ctx.floorReuses();
    let allThere = true;
    for (let g = layer; g < snap.c - snap.l0 + ctx.layersPerStep; g++) {
      if (!(ctx.ready(g) || reuse[g])) {
        allThere = false;
        break;
      }
    }
    if (allThere) return "drop";
    const resume = ctx.resumePassS(ctx.layerOf(layer));
    const outageLoss = snap.ct + (1 + this.latePatience) * resume + left * p.layerCachedS - keepAll;
    return keepAll - dropEnd < outageLoss ? "outage" : "drop";
  }

  recomputeLate(ctx, layer) {
    if (!this._lateSince.has(layer)) this._lateSince.set(layer, ctx.now);
    const since = this._lateSince.get(layer);
    const recent = this._recentRate(ctx);
    const resume = ctx.resumePassS();
    const allowance = this.stallBudget * ctx.fetchNothingS - ctx.stalledS;
    const poll = ctx.profile.layerCachedS;
    const patience = pyMin(this.latePatience * resume, pyMax(ctx.now - since + allowance - poll, 0.0));
    if (ctx.now - since < patience) return false;
    let rate = this.rate(ctx);
    if (ctx.now - since >= resume) {
      if (!recent) return true;
      rate = pyMin(rate, recent);
    }
    const snap = this.snapshot(ctx, rate);
    const stay = new Array(snap.S - snap.cs).fill(snap.l0);
    const wait = snap.finish(stay, null, null, snap.cs);
    const recompute = ctx.now + resume + (ctx.layersPerStep - ctx.layerOf(layer)) * ctx.profile.layerCachedS;
    if (patience < this.latePatience * resume) {
      const overrun = (wait - ctx.now) * (1.0 / this.lateMargin - 1.0);
      const editEnd = snap.finish(stay);
      if (editEnd + overrun > (1.0 + this.stallBudget) * ctx.fetchNothingS) {
        return recompute - ctx.now < (wait - ctx.now) / this.lateMargin;
      }
    }
    return recompute < wait;
  }

  /** Bytes/s the transfer in progress received since the previous ask (null without a report or at the first). */
  _recentRate(ctx) {
    const prog = ctx.linkProgress();
    const last = this._lastProgress;
    if (last !== null && ctx.now === last[0]) return last[3];
    let recent = null;
    if (prog !== null && last !== null) {
      if (Math.abs(ctx.now - prog[0] - last[2]) > 1e-6 || prog[1] < last[1]) {
        recent = prog[1] / pyMax(prog[0] - ctx.rttS, 1e-3);
      } else {
        recent = (prog[1] - last[1]) / (ctx.now - last[0]);
      }
    }
    this._lastProgress = prog === null ? null : [ctx.now, prog[1], ctx.now - prog[0], recent];
    return recent;
  }

  upgrade(ctx) {
    if (ctx.perStep) {
      const [plan, snap] = this._replan(ctx, this.rate(ctx));
      if (snap.pending(plan.splits)) return null;
    }
    let best = null;
    let bestGain = 0.0;
    const fetched = ctx.fetchedLevels();
    for (const [shard, level] of fetched) {
      if (ctx.perStep && shard <= ctx.computeLayer) continue;
      const nxt = shard + ctx.layersPerStep;
      if (ctx.perStep && nxt < ctx.numLayers && !fetched.has(nxt) && feedsTwin(ctx.ladder(shard), level, ctx.ladder(nxt))) continue;
      const ladder = ctx.ladder(shard);
      if (level + 1 < ladder.length && ladder[level + 1].progressive) {
        const gain = (ladder[level].mse - ladder[level + 1].mse) / Math.max(ladder[level + 1].incrementBytes, 1);
        if (gain > bestGain) {
          best = [shard, level + 1];
          bestGain = gain;
        }
      }
    }
    return best;
  }
}

/** A drop here gains at most the template work left in this step; if this shard cannot be decoded within that,
 *  keeping the template finishes no later. */
export function dropCannotPay(ctx, layer, rate) {
  const p = ctx.profile;
  const gain = (ctx.layersPerStep - ctx.layerOf(layer)) * (p.layerFullS - p.layerCachedS);
  let ready = ctx.knownReady(layer);
  if (ready === null) {
    const lv = ctx.ladder(layer)[ctx.floorOf(layer)];
    const start = lv.reuse ? pyMax(ctx.now, ctx.linkBusyUntil()) : ctx.firstByteT();
    ready = start + lv.nbytes / rate + lv.decodeS;
  }
  return ready - pyMax(ctx.computeT, ctx.now) > gain;
}

/** Per-step KV: the probe is not the first shard of the running step while its template is alive. */
function probeSkips(ctx, layer) {
  if (!ctx.perStep || !ctx.templateAlive) return false;
  const step = ctx.stepOf(layer);
  const L = ctx.layersPerStep;
  if (step !== ctx.stepOf(ctx.computeLayer)) return false;
  return layer !== probeShard(ctx, step * L, L);
}

/** The shard the per-step bandwidth probe fetches when the running step starts at shard `first`: the next step's first
 * shard with bytes where its floor decodes on its own or costs off its twins' track no more than the running step's
 * last shard with bytes; else that last shard; else `first` (policy/probe.py's probe_shard). */
function probeShard(ctx, first, L) {
  const reuse = ctx.floorReuses();
  const n = ctx.numLayers;
  let nxt = null;
  for (let g = first + L; g < n; g++) {
    if (!reuse[g]) {
      nxt = g;
      break;
    }
  }
  let last = null;
  for (let g = first + L - 1; g > first; g--) {
    if (!reuse[g]) {
      last = g;
      break;
    }
  }
  if (nxt === null) return last === null ? first : last;
  const selfContained = ctx.ladder(nxt)[ctx.floorOf(nxt)].refStep === null;
  if (selfContained || last === null || ctx.floorOffTrackBytes()[nxt] <= ctx.floorArrays()[0][last]) return nxt;
  return last;
}
