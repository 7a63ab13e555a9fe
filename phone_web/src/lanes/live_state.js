// The policy state the page's lanes keep (sakura_core/runtime/live_state.py): what a policy's Context reads
// (phone_web/src/policy/context.js), on a clock (seconds since the edit started; injectable for tests) that a batch of
// decisions can freeze. Each lane writes its own fields: the fetch lane the link's (nextLayer, inFlight, got,
// receiving, linkFree, decoderFree), the compute lane its position (computeLayer, computeT, templateAlive,
// droppedAt) and the stalls. JavaScript runs one lane's code at a time, so no lock is needed.
import { ThroughputEstimator } from "../policy/index.js";
import { QUEUED } from "./fetch_wire.js";

export const wallClock = () => performance.now() / 1000;

/** The lanes' time: now() in seconds, after(s, fn) -> cancel, sleep(s); tests give a virtual one (run_lanes.mjs). */
export const realTimers = Object.freeze({
  now: wallClock,
  after(s, fn) {
    const id = setTimeout(fn, Math.max(0, s * 1000));
    return () => clearTimeout(id);
  },
  sleep: (s) => new Promise((r) => setTimeout(r, Math.max(0, s * 1000))),
});

export class LiveState {
  /** profile: {layerFullS, layerCachedS, templatePassS, fixedS, steps, ditCpuCores}; ladders, floor: the fetch plan;
   *  rttS: the link's round trip (seconds); clock: () -> seconds; preLanes: [bytes, seconds, round trip] of each
   *  transfer made before the lanes: the estimator's seed at every reset (live_state.py's pre_lanes). */
  constructor({ profile, ladders, floor, layersPerStep, rttS, latencyTargetS = null, estimatorConfig, clock = wallClock,
    preLanes = [] }) {
    this.profile = profile;
    this.ladders = ladders;
    this.floor = floor;
    this.layersPerStep = layersPerStep;
    this.rttS = rttS;
    this.latencyTargetS = latencyTargetS;
    this.estimator = new ThroughputEstimator(estimatorConfig);
    this.preLanes = preLanes;
    this.hasTrace = false; // a live link: the policies use the estimator's rate
    this.requestAhead = false; // the fetch lane sends requests ahead (PipelinedEdit sets it; Context.queuedRttS)
    this.startS = 0.0;
    this.clock = clock;
    this._frozen = null;
    this.reset();
  }

  reset() {
    this.estimator.reset();
    for (const [nbytes, seconds, rttS] of this.preLanes) this.estimator.seed(nbytes, seconds, rttS);
    this.t0 = this.clock();
    this.linkFree = 0.0;
    this.decoderFree = 0.0;
    this.nextLayer = 0;
    this.baseDone = false;
    this.got = new Map(); // shard -> [[level, decoded at s], ...]
    this.inFlight = new Map(); // shard -> predicted ready s
    this.receiving = new Map(); // shard -> [requested at s (QUEUED: waiting for the wire), bytes received, bytes]
    this.onWire = null; // requests ahead: the shard whose bytes hold the wire (see linkProgress)
    this.templateAlive = true;
    this.droppedAt = this.layersPerStep;
    this.stallsDoneS = 0.0;
    this.waitingSince = null;
    this.computeT = 0.0;
    this.computeLayer = 0;
  }

  get now() {
    return this._frozen === null ? this.clock() - this.t0 : this._frozen;
  }

  /** ``fn()`` with ``now`` held at one moment (one batch of decisions sees one moment); its result. */
  frozen(fn) {
    const outer = this._frozen;
    this._frozen = this.now;
    try {
      return fn();
    } finally {
      this._frozen = outer;
    }
  }

  get stalledS() {
    return this.stallsDoneS + (this.waitingSince === null ? 0.0 : Math.max(this.now - this.waitingSince, 0.0));
  }

  /** The transfer in progress, as the simulator's: [seconds since requested, bytes received, its size] of the shard
   *  whose bytes hold the wire (requests sent ahead wait behind it: QUEUED, not in progress), else of the earliest
   *  shard being received (Python's min of the entries); null when none is. */
  linkProgress() {
    let entry = this.onWire === null ? null : (this.receiving.get(this.onWire) ?? null);
    if (entry === null || entry[0] === QUEUED) {
      entry = null;
      for (const e of this.receiving.values()) {
        if (e[0] !== QUEUED && (entry === null || before(e, entry))) entry = e;
      }
    }
    if (entry === null) return null;
    return [this.now - entry[0], Math.min(entry[1], entry[2]), entry[2]];
  }

  flushObservations() {} // transfers are observed when they complete
}

/** Python's list order: the first element that differs decides. */
function before(a, b) {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] < b[i];
  return false;
}
