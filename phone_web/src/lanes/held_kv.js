// Where the page's lanes meet (sakura_core/runtime/held_kv.py): the decoded K/V of each shard (g), who is waiting for
// it, the shards given up on, what the device made, and the bytes held (decoded float32 K/V): now, at peak, and of the
// steps after the running one (the prefetch the memory budget bounds). Per-step KV is freed once its step is done.

export class HeldKV {
  constructor(layersPerStep, shardBytes, timers) {
    this.L = layersPerStep;
    this.timers = timers;
    this.shardBytes = shardBytes; // float32 K and V of one shard
    this.reset();
  }

  reset() {
    this.kv = new Map(); // g -> {k, v, level, name, blobs}
    this.failed = new Set();
    this.device = new Map(); // g -> {k, v}: KV the device's template pass made
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

  /** Per-step KV: free every shard before g (its step is done); the shards freed. */
  releaseBefore(t, g) {
    const freed = [];
    for (const [x, e] of this.kv) {
      if (x < g) {
        this.heldBytes -= e.k.byteLength + e.v.byteLength;
        this.kv.delete(x);
        freed.push(x);
      }
    }
    for (const x of [...this.device.keys()]) if (x < g) this.device.delete(x);
    this._account(t);
    return freed;
  }
}
