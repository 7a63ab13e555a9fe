// The decode lane of the page: a pool of module Web Workers (decode_worker.js), each decoding one shard at a time; a
// job goes to the first idle worker, else waits in order. Where workers cannot start (no Worker: node) the jobs run in
// this thread, one at a time. `decode(blobs, slot)` resolves to {k, v} float32 (decode_job.js).

/** Workers the page starts: one per core beyond the one the compute lane keeps busy, at least 1, at most 4. */
export function defaultDecodeWorkers() {
  const cores = globalThis.navigator?.hardwareConcurrency ?? 2;
  return Math.min(4, Math.max(1, cores - 1));
}

export class DecodePool {
  /** size: workers; makeWorker: () -> Worker (null: decode in this thread). */
  constructor({ size = defaultDecodeWorkers(), makeWorker = null } = {}) {
    this.size = size;
    this._idle = [];
    this._all = [];
    this._queue = [];
    this._jobs = new Map();
    this._next = 0;
    this.inThread = makeWorker === null;
    this._chain = Promise.resolve();
    if (!this.inThread) {
      for (let i = 0; i < size; i++) {
        const w = makeWorker();
        w.onmessage = ({ data }) => this._answer(w, data);
        w.onerror = (e) => this._broken(w, e);
        this._all.push(w);
        this._idle.push(w);
      }
    }
  }

  /** The browser's pool: module workers of decode_worker.js. */
  static forPage(size = defaultDecodeWorkers()) {
    const url = new URL("./decode_worker.js", import.meta.url);
    return new DecodePool({ size, makeWorker: () => new Worker(url, { type: "module" }) });
  }

  /** reference: a cross-step level's decoded reference ({step, digest, k, v}: float16 bits; HeldKV.referenceFor) or
   *  null. */
  decode(blobs, slot, reference = null) {
    if (this.inThread) {
      const run = this._chain.then(async () => (await import("./decode_job.js")).decodeJob(blobs, slot, reference));
      this._chain = run.catch(() => {});
      return run;
    }
    return new Promise((resolve, reject) => {
      const id = this._next++;
      const copies = blobs.map((b) => b.slice().buffer); // the worker gets its own copy (the lane keeps the chain)
      this._jobs.set(id, { resolve, reject });
      const ref = reference === null ? null : { ...reference, k: reference.k.slice(), v: reference.v.slice() }; // its own copy
      this._queue.push({ id, blobs: copies, slot, reference: ref, moved: ref === null ? copies : [...copies, ref.k.buffer, ref.v.buffer] });
      this._pump();
    });
  }

  /** Every worker started and its decoders loaded (a page does this once, at model load: a cold worker's first
   *  shard otherwise waits for the module imports, ~0.9 s under a 4x CPU throttle); resolves when all have answered. */
  warm() {
    if (this.inThread) return import("./decode_job.js").then((m) => m.warmJob());
    const all = this._all.map(() => new Promise((resolve, reject) => {
      const id = this._next++;
      this._jobs.set(id, { resolve, reject });
      this._queue.push({ id, blobs: [], slot: null, warm: true });
    }));
    this._pump();
    return Promise.all(all);
  }

  _pump() {
    while (this._idle.length && this._queue.length) {
      const w = this._idle.shift();
      const job = this._queue.shift();
      const { moved = job.blobs, ...message } = job;
      w.postMessage(message, moved);
    }
  }

  _answer(w, { id, k, v, error, warm = false }) {
    const job = this._jobs.get(id);
    this._jobs.delete(id);
    this._idle.push(w);
    this._pump();
    if (job === undefined) return;
    if (error !== undefined) job.reject(new Error(`decode worker: ${error}`));
    else job.resolve(warm ? null : { k, v });
  }

  _broken(w, e) {
    const why = `a decode worker failed to run (${e.message ?? e}); the page serves decode_worker.js and vendor/fzstd.mjs`;
    for (const job of this._jobs.values()) job.reject(new Error(why));
    this._jobs.clear();
    e.preventDefault?.();
  }

  close() {
    for (const w of this._all) w.terminate();
    this._all = [];
    this._idle = [];
  }
}
