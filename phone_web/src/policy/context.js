// What a fetch policy may look at, as sakura_core/policy/context.py: Context, a read-only typed view of a policy
// state (the page's lanes, or a recorded conformance case). Times are seconds since the edit started, sizes bytes,
// rates bytes/s. The state provides (camelCase of Python's PolicyState):
//   profile { layerFullS, layerCachedS, templatePassS, fixedS, steps, ditCpuCores }, ladders (Level[][]), floor
//   (number or number[]), estimator (ThroughputEstimator), hasTrace, rttS, requestAhead, layersPerStep, startS,
//   latencyTargetS, now, linkFree, decoderFree, computeLayer, computeT, templateAlive, droppedAt, nextLayer,
//   stalledS, got (Map shard -> [[level, decodedAtS], ...] decoded by now), inFlight (Map shard -> predicted ready s);
//   optionally flushObservations(), linkProgress() -> [sinceRequestS, bytesReceived, bytes] | null,
//   knownReadyArray() -> Float64Array (NaN = unknown), fetchedLevels() -> Map shard -> highest level requested.
import { expectedNbytes, fetchBytes, levelsFrom, shardFloor } from "./ladder.js";
import { fixed, pyMax, pyMin } from "./pyfloat.js";

const STATE_MEMBERS = ["profile", "ladders", "floor", "estimator", "rttS", "layersPerStep", "startS", "latencyTargetS",
  "now", "linkFree", "decoderFree", "computeLayer", "computeT", "templateAlive", "droppedAt", "nextLayer", "stalledS",
  "got", "inFlight"];

export class Context {
  constructor(state) {
    const missing = STATE_MEMBERS.filter((m) => !(m in state));
    if (missing.length) {
      throw new TypeError(`the policy state lacks ${missing.join(", ")}; give it those members (see phone_web/src/policy/context.js)`);
    }
    this._s = state;
    this._floorArrays = null;
    this._floorReuse = null;
    this._floorOff = null;
    this._perStep = null;
  }

  get profile() { return this._s.profile; }
  get numLayers() { return this._s.ladders.length; }
  floorOf(shard) { return shardFloor(this._s.floor, shard); }
  levelsFromFloor(shard) { return levelsFrom(this._s.ladders[shard], this.floorOf(shard)); }
  get estimator() {
    if (this._s.flushObservations) this._s.flushObservations();
    return this._s.estimator;
  }
  get hasTrace() { return Boolean(this._s.hasTrace); }
  /** The runtime fetches a shard's re-root chain where the policy names one (rerootChain): plans may price it. */
  get reroots() { return Boolean(this._s.reroots); }
  ladder(layer) { return this._s.ladders[layer]; }

  /** [bytes as planned, decode seconds] of every shard's floor level (Float64Arrays, made once). */
  floorArrays() {
    if (this._floorArrays === null) {
      const lads = this._s.ladders;
      const n = lads.length;
      const nb = new Float64Array(n);
      const dec = new Float64Array(n);
      const reuse = new Array(n);
      for (let g = 0; g < n; g++) {
        const lv = lads[g][this.floorOf(g)];
        nb[g] = expectedNbytes(lv);
        dec[g] = lv.decodeS;
        reuse[g] = lv.reuse;
      }
      this._floorArrays = [nb, dec];
      this._floorReuse = reuse;
    }
    return this._floorArrays;
  }

  /** Every shard's floor bytes when fetched off its twins' track. */
  floorOffTrackBytes() {
    if (this._floorOff === null) {
      this._floorOff = Float64Array.from(this._s.ladders, (lad, g) => fetchBytes(lad, this.floorOf(g), false));
    }
    return this._floorOff;
  }

  /** (layers,) booleans: layer l of `step` is fetched off its twins' track as things stand (its reference, the
   *  same layer a step earlier, neither requested nor held at its floor level); `requested`: per shard. */
  offTrack(step, requested) {
    const L = this.layersPerStep;
    const out = new Array(L).fill(false);
    if (!this.perStep || step <= 0) return out;
    for (let layer = 0; layer < L; layer++) {
      const ref = (step - 1) * L + layer;
      const held = this._s.got.get(ref);
      if (held && held.length) out[layer] = Math.max(...held.map((x) => x[0])) !== this.floorOf(ref);
      else out[layer] = !requested[ref];
    }
    return out;
  }

  floorReuses() {
    this.floorArrays();
    return this._floorReuse;
  }

  get now() { return this._s.now; }
  get templateAlive() { return this._s.templateAlive; }
  get stalledS() { return this._s.stalledS; }

  /** Predicted latency of the edit fetching nothing. */
  get fetchNothingS() {
    const p = this.profile;
    return this.templateWorkS + this.steps * this.layersPerStep * p.layerCachedS + p.fixedS;
  }

  /** Seconds of the fallback template pass from layer `fromLayer` of the step (default: where it was dropped). */
  resumePassS(fromLayer = null) {
    const L = this.layersPerStep;
    const k = fromLayer === null ? this._s.droppedAt : fromLayer;
    return (this.profile.templatePassS * (L - Math.min(Math.max(Math.trunc(k), 0), L))) / L;
  }

  get computeLayer() { return this._s.computeLayer; }
  get latencyTargetS() { return this._s.latencyTargetS; }
  get decidedUpto() { return this._s.nextLayer; }

  /** Shard `layer` has a level decoded by now. */
  ready(layer) {
    const got = this._s.got.get(layer);
    return Boolean(got && got.length) && got[0][1] <= this._s.now;
  }

  /** Map layer -> highest level fetched (decoded or not where the state says so). */
  fetchedLevels() {
    if (this._s.fetchedLevels) return this._s.fetchedLevels();
    const out = new Map();
    for (const [g, got] of this._s.got) if (got.length) out.set(g, Math.max(...got.map((x) => x[0])));
    return out;
  }

  get layersPerStep() { return this._s.layersPerStep; }
  get perStep() {
    if (this._perStep === null) this._perStep = this._s.ladders.length > this.layersPerStep;
    return this._perStep;
  }
  stepOf(shard) { return this.perStep ? Math.floor(shard / this.layersPerStep) : 0; }
  layerOf(shard) { return shard % this.layersPerStep; }
  get steps() { return this.profile.steps; }
  get templateWorkS() { return this.profile.templatePassS * (this.perStep ? this.steps : 1); }
  get computeT() { return this._s.computeT; }
  get rttS() { return this._s.rttS; }
  get queuedRttS() { return this._s.requestAhead ? 0.0 : this.rttS; }

  /** Decoded-at time of the shard's first level if decoded by now, else its predicted ready time, else null. */
  knownReady(shard) {
    const got = this._s.got.get(shard);
    if (got && got.length && got[0][1] <= this._s.now + 1e-12) return got[0][1];
    const pred = this._s.inFlight.get(shard);
    return pred === undefined ? null : pred;
  }

  /** knownReady of every shard (a fresh Float64Array, NaN where null). */
  knownReadyArray() {
    if (this._s.knownReadyArray) return Float64Array.from(this._s.knownReadyArray());
    const out = new Float64Array(this.numLayers).fill(NaN);
    const now = this._s.now + 1e-12;
    for (const [g, t] of this._s.inFlight) out[g] = t;
    for (const [g, got] of this._s.got) if (got.length && got[0][1] <= now) out[g] = got[0][1];
    return out;
  }

  /** Shards requested and not decoded by now, in shard order. */
  pendingShards() {
    return [...this._s.inFlight.keys()].filter((g) => !this.ready(g)).sort((a, b) => a - b);
  }

  /** The transfer in progress: [seconds since requested, bytes received, its size], or null. */
  linkProgress() {
    return this._s.linkProgress ? this._s.linkProgress() : null;
  }

  /** `rate`, lowered to the in-progress transfer's rate when that transfer is overdue under it. */
  slowed(rate) {
    const prog = this.linkProgress();
    if (prog === null || prog[0] <= this.rttS + prog[2] / rate) return rate;
    return pyMin(rate, pyMax(prog[1], 1.0) / pyMax(prog[0] - this.rttS, 1e-3));
  }

  firstByteT() {
    return pyMax(this._s.now + this.rttS, this.linkBusyUntil() + this.queuedRttS);
  }

  /** Predicted end of the transfers already requested (now when none is pending). */
  linkBusyUntil() {
    let busy = null;
    for (const t of this._s.inFlight.values()) if (t > this._s.now && (busy === null || t > busy)) busy = t;
    return busy === null ? this._s.now : busy;
  }

  fmtRate(rate) {
    return rate === null ? "exact trace" : `${fixed((rate * 8) / 1e6, 2)} Mbit/s`;
  }

  /** When `nbytes` requested at `start` arrive at `rate` (the page has no trace: a rate is required). */
  transferEnd(start, nbytes, rate, rttS = null) {
    if (rate === null) throw new RangeError("exact transfer times need a trace; the page has none (use an estimated rate)");
    const t0 = start + (rttS === null ? this._s.rttS : rttS);
    return t0 + nbytes / rate;
  }

  templateEta(layer) {
    return this._s.computeT + Math.max(0, layer - this._s.computeLayer) * this.profile.layerFullS;
  }

  deadline(layer) {
    const p = this.profile;
    const c = this._s.computeLayer;
    const extra = this._s.templateAlive ? p.layerFullS : p.layerCachedS;
    return this._s.computeT + (layer > c ? extra : 0.0) + Math.max(0, layer - c - 1) * p.layerCachedS;
  }
}
