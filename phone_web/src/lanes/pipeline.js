// The page's pipelined edit (sakura_core/runtime/pipeline.py): a fetch lane (the link, as the policy chooses), a
// decode lane (a pool of Web Workers) and a compute lane (the template pass and the DiT steps on this thread),
// overlapped; they meet in HeldKV and share the LiveState the policy reads (through its Context) and the RunLog.
// Everything the lanes touch is injected (fetchBlob, the pool, computeStep, the template pass, the clock), so node
// tests run the same lanes with fakes (phone_web/test/run_lanes.mjs). See docs/phone.md "The page's lanes".
import { Context, EstimatorConfig, makePolicy } from "../policy/index.js";
import { ComputeLane } from "./compute_lane.js";
import { FetchLane } from "./fetch_lane.js";
import { HeldKV } from "./held_kv.js";
import { pageLadders } from "./ladders.js";
import { LiveState, realTimers } from "./live_state.js";
import { MeasuredProfile } from "./measured_profile.js";
import { timedPolicy } from "./policy_time.js";
import { busyS, RunLog } from "./timeline.js";

/** The prefetch budget when none is given: 1/16 of the device memory the browser reports (navigator.deviceMemory,
 *  GiB as the browser rounds it; 4 GiB when it reports none): 256 MiB on 4 GiB, 512 MiB on 8. */
export function defaultBudgetBytes() {
  const gib = globalThis.navigator?.deviceMemory ?? 4;
  return Math.round((gib * 2 ** 30) / 16);
}

export class PipelinedEdit {
  /** raw: the manifest JSON; policy: a name (makePolicy); fetchBlob(digest, bytes, onChunk); pool: decode(blobs,
   *  slot); slotOf(g, rep); computeStep(step, kv); templatePass / templateTokens: see ComputeLane; times: flow times;
   *  steps; tokens, heads, headDim: one shard's K/V geometry; budgetBytes (null: unbounded); rttS: the link's round
   *  trip; profile: the costs planned with at first (null: from `measured`); measured: the page session's
   *  MeasuredProfile (measured_profile.js; null: a fresh one, this edit's own), fed every step, template-pass
   *  layer and decode (the ladders' decode seconds are its rates); timers: the lanes' time (live_state.js
   *  realTimers; tests a virtual one); onEvent(kind, entry): each event / decision as it is logged; rttFromFirstByte: rttS replaced by the first transfer's time to its first byte;
   *  requestAhead: the fetch lane's requests go ahead of the wire (fetch_lane.js; false: one request at a time).
   *  preLanes: [bytes, seconds, round trip] of each transfer made before the lanes, seeding the estimator. */
  constructor({ raw, policy, fetchBlob, pool, slotOf, computeStep, templatePass = null, templateTokens = null,
    times, steps, tokens, heads, headDim, budgetBytes = defaultBudgetBytes(), rttS = 0.05, profile = null,
    measured = null, latencyTargetS = null, timers = realTimers, onEvent = () => {}, upgrades = true, shardWaitS = 120,
    rttFromFirstByte = false, requestAhead = true, preLanes = [] }) {
    this.policySpent = { s: 0, calls: 0 }; // the policy's asks: wall seconds on the page's thread, and how many
    this.policy = timedPolicy(typeof policy === "string" ? makePolicy(policy) : policy, this.policySpent);
    if (this.policy.templateEveryStep && templatePass === null) {
      throw new Error(`policy ${this.policy.name} computes every layer's template KV on the device, which needs per-layer ` +
        "template graphs this model's files lack (template_pass.js); choose fetch-fp16 or sakura, or export the model again");
    }
    this.measured = measured ?? new MeasuredProfile();
    this.plan = pageLadders(raw, this.policy.family, this.measured.decodeRates()); // decodes as fast as measured
    const L = this.plan.layers;
    this.shardBytes = 2 * tokens * heads * headDim * 4; // float32 K and V of one layer
    this.budgetBytes = budgetBytes;
    this.log = new RunLog();
    for (const kind of ["event", "decision"]) {
      const inner = this.log[kind].bind(this.log);
      this.log[kind] = (...args) => { inner(...args); const list = kind === "event" ? this.log.events : this.log.decisions; onEvent(kind, list[list.length - 1]); };
    }
    this.st = new LiveState({ profile: profile ?? this.measured.profileFor(L, steps, templatePass !== null), ladders: this.plan.ladders,
      floor: this.plan.floor, layersPerStep: L, rttS, latencyTargetS, estimatorConfig: new EstimatorConfig(), clock: timers.now,
      preLanes });
    this.ctx = new Context(this.st);
    this.held = new HeldKV(L, this.shardBytes, timers, this.plan.perStep ? this.plan.ladders : []);
    this.fetch = new FetchLane({ plan: this.plan, st: this.st, ctx: this.ctx, policy: this.policy, held: this.held, pool,
      log: this.log, fetchBlob, slotOf, budgetBytes: this.plan.perStep ? budgetBytes : null, shardBytes: this.shardBytes, timers, upgrades,
      rttFromFirstByte, requestAhead, measured: this.measured });
    this.compute = new ComputeLane({ plan: this.plan, st: this.st, ctx: this.ctx, policy: this.policy, held: this.held,
      fetch: this.fetch, log: this.log, computeStep, templatePass, templateTokens, times, steps, shardWaitS,
      measured: this.measured });
  }

  /** Run the lanes overlapped; the lanes' part of the report. */
  async run() {
    for (const x of [this.st, this.log, this.held, this.fetch, this.compute]) x.reset();
    this.policy.reset();
    Object.assign(this.policySpent, { s: 0, calls: 0 });
    this.st.requestAhead = this.fetch.ahead; // Context.queuedRttS: the policy's view of the lane's requests
    const link = this.fetch.run();
    let linkError = null;
    link.catch((e) => { // the lane broke (a bug, not a failed shard: those fall back inside it): nothing more comes
      linkError = e;
      for (let g = 0; g < this.plan.ladders.length; g++) {
        if (!this.held.isReady(g)) {
          this.log.fallback(`shard ${g}: the fetch lane stopped (${e.message})`);
          this.held.fail(g);
        }
      }
    });
    try {
      await this.compute.run();
    } finally {
      this.fetch.stop();
    }
    if (linkError !== null) this.log.fallback(`the fetch lane ended with ${linkError.message}`);
    return this.report();
  }

  report() {
    const st = this.st;
    return {
      policy: this.policy.name,
      latency_s: st.now,
      kv_mode: this.plan.perStep ? "per-step" : "single",
      rtt_s: st.rttS,
      request_ahead: this.fetch.ahead, // at the end: false if the fetcher turned out not to await its turns
      layers_per_step: this.plan.layers,
      split_layers: this.compute.splitLayers,
      levels_used: this.compute.levelsUsed,
      bytes_fetched: this.fetch.bytesFetched,
      floor: this.plan.floor.map((f, g) => this.plan.ladders[g][f].name),
      timeline: this.log.events,
      decisions: this.log.decisions,
      fallbacks: this.log.fallbacks,
      busy_s: busyS(this.log.events),
      stalled_s: st.stallsDoneS,
      memory: { budget_bytes: this.budgetBytes, budget_applies: this.plan.perStep, shard_kv_bytes: this.shardBytes,
        peak_held_bytes: this.held.peakHeldBytes, peak_prefetch_bytes: this.held.peakPrefetchBytes,
        held_bytes_at_end: this.held.heldBytes, held_samples: this.held.samples },
      per_step_s: this.compute.stepS,
      policy_s: this.policySpent.s, // the policy's asks' seconds on the page's thread (policy_time.js)
      policy_calls: this.policySpent.calls,
    };
  }
}
