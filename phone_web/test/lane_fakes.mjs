// The fakes of the page's lanes scenarios (run_lanes.mjs): a virtual clock, fake manifests (self-contained levels, and
// a per-step template of cross-step levels), a fake link, decoder (a value per shard; a cross-step level's the
// reference's plus its own), DiT step and template pass, and `edit` (one pipelined edit with them).
import { f16Table } from "../src/f16.js";
import { PipelinedEdit } from "../src/lanes/pipeline.js";

export const L = 4;
const TOKENS = 8;
const HEADS = 2;
const HD = 4;
export const PER = TOKENS * HEADS * HD; // one layer's K (or V) values

/** Virtual time for the lanes (their `timers`): a timer fires when every promise that can settle has settled. */
export class VirtualTime {
  constructor() {
    this.t = 0;
    this.queue = [];
    this.seq = 0;
    this.now = () => this.t;
    this.sleep = (s) => new Promise((r) => this.after(s, r));
  }

  after(s, fn) {
    const e = { at: this.t + Math.max(0, s), seq: this.seq++, fn, live: true };
    this.queue.push(e);
    return () => { e.live = false; };
  }

  /** Run ``promise`` to its end, firing the timers in time order. */
  async drive(promise) {
    let done = false;
    let value;
    let error = null;
    promise.then((v) => { done = true; value = v; }, (e) => { done = true; error = e; });
    while (!done) {
      await new Promise((r) => setImmediate(r)); // every microtask settled
      if (done) break;
      this.queue = this.queue.filter((e) => e.live).sort((a, b) => a.at - b.at || a.seq - b.seq);
      if (!this.queue.length) throw new Error("the lanes wait on nothing: a deadlock");
      const e = this.queue.shift();
      this.t = Math.max(this.t, e.at);
      e.fn();
    }
    if (error !== null) throw error;
    return value;
  }
}
const hex = (n) => n.toString(16).padStart(64, "0");

/** A manifest of L one-layer shards (per step with ``steps``): sakura-l1 (30 dB), sakura-l2 (36 dB, refines l1),
 *  fp16; digests hex of a counter; sizes in bytes. */
export function manifest(steps = null) {
  let d = 0;
  const shards = [];
  for (let s = 0; s < (steps ?? 1); s++) {
    for (let l = 0; l < L; l++) {
      const l1 = hex(++d);
      const l2 = hex(++d);
      shards.push({ layers: [l, l], ...(steps ? { step: s } : {}), representations: [
        { name: "fp16", codec: "fp16", level: 0, digest: hex(++d), bytes: 40000, requires: [], psnr_db: null },
        { name: "sakura-l1", codec: "sakura", level: 1, digest: l1, bytes: 6000, requires: [], psnr_db: 30 },
        { name: "sakura-l2", codec: "sakura", level: 2, digest: l2, bytes: 6000, requires: [l1], psnr_db: 36 },
      ] });
    }
  }
  return { template_id: "fake", model_id: "m", num_layers: L, token_grid: [TOKENS, 1], heads: HEADS, head_dim: HD,
    kv_mode: steps ? "per-step" : "single", ...(steps ? { schedule: { steps } } : {}), shards };
}

/** A per-step manifest of cross-step levels (as publish_template's per-step sakura, full store): step 0 as
 *  manifest(); each later step a zero-byte reuse rung on the step before, sakura-l1 (30 dB) and sakura-l2 (36 dB) as
 *  residuals on it (one blob each), fp16, and closed-loop twins sakura-l1+cl (37 dB: the track floor) and
 *  sakura-l2+cl, coded against the step before's same level (step 0's, then the twin). */
export function crossManifest(steps) {
  const raw = manifest(steps);
  const own = (s, l, name) => raw.shards[(s * L) + l].representations.find((r) => r.name === name);
  let d = 10000;
  for (let s = 1; s < steps; s++) {
    for (let l = 0; l < L; l++) {
      const prev = (name) => own(s - 1, l, s === 1 ? name.replace("+cl", "") : name).digest;
      const residual = (mode, step, digest) => ({ ref: { mode, step, digest } });
      const fp16 = own(s - 1, l, "fp16").digest;
      raw.shards[s * L + l].representations = [
        { name: "reuse", codec: "reuse", level: 0, digest: null, bytes: 0, requires: [], psnr_db: 25, ...residual("reuse", s - 1, fp16) },
        { name: "sakura-l1", codec: "sakura", level: 1, digest: hex(++d), bytes: 1500, requires: [], psnr_db: 30, ...residual("residual", s - 1, fp16) },
        { name: "sakura-l2", codec: "sakura", level: 2, digest: hex(++d), bytes: 2500, requires: [], psnr_db: 36, ...residual("residual", s - 1, fp16) },
        { name: "fp16", codec: "fp16", level: 3, digest: hex(++d), bytes: 40000, requires: [], psnr_db: null },
        { name: "sakura-l1+cl", codec: "sakura", level: 4, digest: hex(++d), bytes: 1000, requires: [], psnr_db: 37, ...residual("closed", s - 1, prev("sakura-l1+cl")) },
        { name: "sakura-l2+cl", codec: "sakura", level: 5, digest: hex(++d), bytes: 1200, requires: [], psnr_db: 40, ...residual("closed", s - 1, prev("sakura-l2+cl")) },
      ];
    }
  }
  return raw;
}

/** What a cross-step level adds to its reference in the fake decoder (integers: exact in float16). */
export const delta = (step, name) => 100 * step + { "sakura-l1": 1, "sakura-l2": 2, "sakura-l1+cl": 4, "sakura-l2+cl": 5 }[name];

/** The value a decoded shard holds: which layer, step and level it is. */
export const mark = (layer, step, name) => 1000 * (step ?? 0) + 10 * layer + { "sakura-l1": 1, "sakura-l2": 2, fp16: 3 }[name];

/** A link whose server sends the requested blobs one after another at ``bytesPerS`` (first in, first out: one TCP
 *  connection's worth), each request's first byte a round trip ``rttS`` after it left; ``busy`` lists when the wire
 *  carried each blob. The reader's chunks come as the bytes arrive, or once the lane lets it read on (its turn). */
function fifoLink(vt, { bytesPerS, rttS }) {
  let wireFree = 0;
  const busy = [];
  const until = (t) => vt.sleep(Math.max(0, t - vt.t));
  const fetchBlob = async (digest, bytes, onChunk) => {
    const start = Math.max(vt.t + rttS, wireFree);
    const end = start + bytes / bytesPerS;
    wireFree = end;
    busy.push([start, end]);
    for (let i = 1; i <= 4; i++) {
      await until(start + (i * (end - start)) / 4);
      await onChunk(bytes / 4);
    }
    return new Uint8Array(bytes);
  };
  return { fetchBlob, busy };
}

export function fakes(vt, { bytesPerS = 4e5, hang = null, stepS = 0.03, rttS = 0, fifo = false, awaitsTurns = true } = {}) {
  const sleep = vt.sleep;
  const requested = [];
  const requestedAt = new Map(); // digest -> the virtual time it was requested
  const wire = fifo ? fifoLink(vt, { bytesPerS, rttS }) : null;
  const fetchBlob = async (digest, bytes, onChunk) => {
    requested.push(digest);
    requestedAt.set(digest, vt.t);
    if (wire !== null) return wire.fetchBlob(digest, bytes, onChunk);
    if (rttS > 0) await sleep(rttS); // each request's round trip
    const total = digest === hang ? 3.0 : bytes / bytesPerS; // one blob stalls (a late shard)
    for (let i = 0; i < 4; i++) {
      await sleep(total / 4);
      const turn = onChunk(bytes / 4); // the wire's turn (requests ahead): fetchShard awaits it before reading on
      if (awaitsTurns) await turn;
    }
    return new Uint8Array(bytes);
  };
  const decodes = []; // {step, layer, name, ref: the reference's value (float16 bits widened) or null, value}
  const pool = { decode: async (blobs, slot, reference = null) => {
    await sleep(0.01);
    const ref = reference === null ? null : f16Table()[reference.k[0]];
    const x = ref === null ? mark(slot.layers[0], slot.step, slot.levelName) : ref + delta(slot.step, slot.levelName);
    decodes.push({ step: slot.step, layer: slot.layers[0], name: slot.levelName, ref, value: x, refStep: reference?.step ?? null });
    return { k: new Float32Array(PER).fill(x), v: new Float32Array(PER).fill(-x) };
  } };
  const seen = [];
  const computeStep = async (step, kv) => {
    seen.push(kv.map((x) => x.k[0]));
    await sleep(stepS);
  };
  const pass = { layers: L, async begin(tokens, time) {
    return { nextLayer: 0, disposed: false, async next() {
      await sleep(0.01);
      const layer = this.nextLayer++;
      return { layer, k: new Float32Array(PER).fill(-(layer + 1)), v: new Float32Array(PER).fill(layer + 1) };
    }, dispose() { this.disposed = true; } };
  } };
  return { requested, requestedAt, fetchBlob, pool, seen, computeStep, pass, busy: wire?.busy ?? null, decodes };
}

export async function edit(policy, { steps = 3, perStep = true, pass = false, budgetBytes = null, link = {}, profile = null,
  measured = null, requestAhead = true, rttS = 0.01, preLanes = [], cross = false } = {}) {
  const raw = cross ? crossManifest(steps) : manifest(perStep ? steps : null);
  const vt = new VirtualTime();
  const f = fakes(vt, link);
  const e = new PipelinedEdit({ raw, policy, timers: vt, fetchBlob: f.fetchBlob, pool: f.pool, computeStep: f.computeStep,
    slotOf: (g, rep) => ({ layers: [g % L, g % L], step: perStep ? Math.floor(g / L) : null, levelName: rep.name }),
    templatePass: pass ? f.pass : null, templateTokens: async () => new Float32Array(4), times: [1, 0.66, 0.33, 0],
    steps, tokens: TOKENS, heads: HEADS, headDim: HD, budgetBytes, rttS, profile, measured, requestAhead, preLanes });
  const report = await vt.drive(e.run());
  return { raw, f, report, e };
}

