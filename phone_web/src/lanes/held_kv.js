// Where the page's lanes meet (sakura_core/runtime/held_kv.py): the decoded K/V of each shard (g), who is waiting for
// it, the shards given up on, what the device made, and the bytes held (decoded float32 K/V): now, at peak, and of the
// steps after the running one (the prefetch the memory budget bounds). Per-step KV is freed once its step is done.
// Cross-step templates (sakura_core/runtime/held_kv.py): a residual level of shard (s, layer) decodes against the KV
// the device holds of its reference (s', layer) — fetched at any level, or made here (a fallback pass, or the template
// layers the device ran at step s': keepReferences); a closed-loop twin only against the one representation it names
// (each fetched KV keeps the digest it was decoded from: closedTwin). A passed shard stays held while a shard that may
// still be fetched at a level referencing it is neither decoded nor given up (releaseBefore); its bytes count.
import { MissingReferenceError } from "../errors.js";
import { f32ToF16 } from "../f16.js";

const DECODED_REF_MODES = ["residual", "closed"];

/** Float32 K or V as the float16 bits a reference is added in (the codec decodes to float16). */
function toF16(x) {
  if (x instanceof Uint16Array) return x;
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32ToF16(x[i]);
  return out;
}

export class HeldKV {
  /** ladders: per shard the levels the policy may fetch; a level with a refStep (or a twin) makes the same layer of
   *  that step a reference, kept past the compute lane while the shard may still need it. */
  constructor(layersPerStep, shardBytes, timers, ladders = []) {
    this.L = layersPerStep;
    this.timers = timers;
    this.shardBytes = shardBytes; // float32 K and V of one shard
    this.dependents = new Map(); // reference shard -> shards with a level on it
    ladders.forEach((levels, g) => {
      const steps = new Set(levels.flatMap((lv) => [lv.refStep, lv.closed?.refStep ?? null]).filter((x) => x !== null));
      for (const s of steps) {
        const ref = s * this.L + (g % this.L);
        this.dependents.set(ref, [...(this.dependents.get(ref) ?? []), g]);
      }
    });
    this.reset();
  }

  reset() {
    this.kv = new Map(); // g -> {k, v, level, name, digest (the last blob of the chain it was decoded from)}
    this.failed = new Set();
    this.device = new Map(); // g -> {k, v}: KV the device's template pass made (holdDevice, keepReferences)
    this.kept = new Set(); // passed shards still held as the reference of a shard not decoded yet
    this.releasedBelow = 0;
    this._waiters = new Map(); // g -> [resolve, ...]
    this.heldBytes = 0;
    this.peakHeldBytes = 0;
    this.peakPrefetchBytes = 0;
    this.runningEnd = this.L; // the first shard after the running step
    this.samples = []; // [t, held bytes, prefetch bytes] after each change
  }

  isReady(g) { return this.kv.has(g); }
  isFailed(g) { return this.failed.has(g); }

  /** Bytes held for shards >= g (the steps after the running one, with g = its end). */
  heldFrom(g) {
    let n = 0;
    for (const [x, e] of this.kv) if (x >= g) n += e.k.byteLength + e.v.byteLength;
    return n;
  }

  _account(t) {
    const prefetch = this.heldFrom(this.runningEnd);
    this.peakHeldBytes = Math.max(this.peakHeldBytes, this.heldBytes);
    this.peakPrefetchBytes = Math.max(this.peakPrefetchBytes, prefetch);
    this.samples.push([t, this.heldBytes, prefetch]);
  }

  /** A decoded shard (replacing a lower level of it: an upgrade); wakes whoever waits for it. */
  publish(t, g, entry) {
    const old = this.kv.get(g);
    if (old) this.heldBytes -= old.k.byteLength + old.v.byteLength;
    this.kv.set(g, entry);
    this.heldBytes += entry.k.byteLength + entry.v.byteLength;
    this._account(t);
    this._wake(g, true);
  }

  fail(g) {
    this.failed.add(g);
    this._wake(g, false);
  }

  /** Resolves true once shard g is decoded, false when it failed or ``timeoutS`` passed (null: no timeout). */
  waitReady(g, timeoutS = null) {
    if (this.kv.has(g)) return Promise.resolve(true);
    if (this.failed.has(g)) return Promise.resolve(false);
    return new Promise((resolve) => {
      const list = this._waiters.get(g) ?? [];
      let cancel = null;
      const done = (ok) => { if (cancel !== null) cancel(); resolve(ok); };
      list.push(done);
      this._waiters.set(g, list);
      if (timeoutS !== null) {
        cancel = this.timers.after(timeoutS, () => {
          const l = this._waiters.get(g) ?? [];
          this._waiters.set(g, l.filter((x) => x !== done));
          resolve(this.kv.has(g));
        });
      }
    });
  }

  _wake(g, ok) {
    const list = this._waiters.get(g) ?? [];
    this._waiters.delete(g);
    for (const w of list) w(ok);
  }

  /** The running step moves on: shards before ``end`` are no longer prefetch. */
  setRunningEnd(t, end) {
    this.runningEnd = end;
    this._account(t);
  }

  /** The device's own KV for shard g (a fallback template pass), counted in the bytes held. */
  holdDevice(t, g, kv) {
    if (g < this.releasedBelow || this.device.has(g)) return;
    this.device.set(g, kv);
    this.heldBytes += kv.k.byteLength + kv.v.byteLength;
    this._account(t);
  }

  /** The template KV the device computed at a step (g -> {k, v}): kept for the shards that are still the reference
   *  of a shard not decoded yet and not held already; the rest is not kept. */
  keepReferences(t, kvFrom) {
    for (const [g, kv] of kvFrom) {
      if (this.kv.has(g) || this.device.has(g) || !this._referenced(g)) continue;
      this.device.set(g, kv);
      this.heldBytes += kv.k.byteLength + kv.v.byteLength;
      if (g < this.releasedBelow) this.kept.add(g);
    }
    this._account(t);
  }

  /** Per-step KV: free every shard before g (its step is done) unless it is the reference of a shard that may
   *  still be fetched against it (freed at a later call, once none does); the shards freed. */
  releaseBefore(t, g) {
    const freed = [];
    this.releasedBelow = Math.max(this.releasedBelow, g);
    const passed = new Set([...this.kv.keys(), ...this.device.keys()].filter((x) => x < g));
    for (const x of passed) {
      if (this._referenced(x)) {
        this.kept.add(x);
        continue;
      }
      this.kept.delete(x);
      for (const m of [this.kv, this.device]) {
        const e = m.get(x);
        if (e === undefined) continue;
        this.heldBytes -= e.k.byteLength + e.v.byteLength;
        m.delete(x);
      }
      freed.push(x);
    }
    this._account(t);
    return freed;
  }

  /** Shard x is the reference of a shard not passed, not decoded and not given up on. */
  _referenced(x) {
    return (this.dependents.get(x) ?? []).some((d) => d >= this.releasedBelow && !this.kv.has(d) && !this.failed.has(d) && !this.device.has(d));
  }

  _refShard(g, step) { return step * this.L + (g % this.L); }

  /** The decoded reference ({step, digest, k, v}: float16 bits) representation ``rep`` of shard g needs: null for a
   *  self-contained one; the KV held of its reference shard (fetched at any level, or the device's) for a residual.
   *  Throws MissingReferenceError when the device holds none (or, for a closed-loop twin, not the one it names). */
  referenceFor(g, rep) {
    const ref = rep.ref ?? null;
    if (ref === null || !DECODED_REF_MODES.includes(ref.mode)) return null;
    const x = this._refShard(g, ref.step);
    const entry = this.kv.get(x) ?? this.device.get(x) ?? null;
    if (entry === null) {
      throw new MissingReferenceError(`its level ${rep.name} is coded against step ${ref.step} layer ${g % this.L}, which the device does not hold (not fetched, or freed)`);
    }
    if (ref.mode === "closed" && this.kv.get(x)?.digest !== ref.digest) {
      throw new MissingReferenceError(`its closed-loop level ${rep.name} is coded against one representation of step ${ref.step} layer ${g % this.L}; the device holds another`);
    }
    return { step: ref.step, digest: ref.digest, k: toF16(entry.k), v: toF16(entry.v) };
  }

  /** The closed-loop twin of representation ``rep`` of shard g (rep.closedTwin) when the device holds the one
   *  representation of its reference it is coded against (then it replaces rep); else null. */
  closedTwin(g, rep) {
    const twin = rep.closedTwin ?? null;
    if (twin === null || (twin.ref ?? null) === null) return null;
    return this.kv.get(this._refShard(g, twin.ref.step))?.digest === twin.ref.digest ? twin : null;
  }
}
