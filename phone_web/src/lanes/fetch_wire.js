// The fetch lane's wire when requests go ahead (sakura_core/runtime/fetch_wire.py): the lane's transfers take it one
// at a time, first in first out, while their requests (and round trips) go ahead of it. A shard's Turn is the thenable
// the lane's onChunk returns at the shard's first chunk (fetchShard awaits it before it reads on); it holds the wire
// until the shard's transfer has ended. untilWindow is when the lane may send its next request: requestGate
// (lane_rules.js) on the bytes requested and not yet received. A fetcher that does not await its turns reads on: the
// wire says so (ungated) and the lane goes back to one request at a time.
import { requestGate } from "./lane_rules.js";

export const QUEUED = Infinity; // a receiving entry's start while its request waits for the wire behind another

/** A settable promise (Python's asyncio.Event, set once). */
export function signal() {
  let set;
  const p = new Promise((r) => { set = r; });
  p.set = set;
  return p;
}

export class Wire {
  constructor(st) {
    this.st = st;
    this.turns = new Set(); // the transfers requested and not ended
    this.sent = new Map(); // g -> signal: its request has left
    this.ended = new Map(); // g -> signal: its transfer has ended
    this.ungated = false;
    this._holder = null; // the turn holding the wire
    this._queue = []; // turns waiting for it, first in first out
    this._progress = signal();
  }

  /** Signals set once shard g's request has left (open) and once its transfer has ended (landed). */
  expect(g) {
    const sent = signal();
    const landed = signal();
    this.sent.set(g, sent);
    this.ended.set(g, landed);
    return { sent, landed };
  }

  landed(g) {
    this.ended.get(g)?.set();
  }

  forget(g) {
    this.sent.delete(g);
    this.ended.delete(g);
  }

  /** Shard g's transfer of ``size`` bytes is requested: its turn. */
  open(g, size) {
    const turn = new Turn(this, g, size);
    this.turns.add(turn);
    this.sent.get(g)?.set();
    return turn;
  }

  /** The transfer has ended (received, failed or cancelled): its turn released. */
  close(turn) {
    turn.release();
    this.turns.delete(turn);
    this.ungated ||= turn.offered && !turn.held; // onChunk's turn was never awaited
    this._wake();
  }

  /** ``n`` more bytes came: the turn the fetcher must await before reading on while the shard does not hold the
   *  wire (every blob of its chain: each awaits it at its first chunk), else undefined. */
  received(turn, n) {
    turn.left = Math.max(turn.left - n, 0);
    if (turn.grantedT !== null) turn.after += n;
    this._wake();
    if (turn.acquired) return undefined;
    turn.offered = true;
    return turn;
  }

  /** Give the estimator a transfer requested at t0 and ended at t1; returns when it began. One that waited for the
   *  wire is the bytes after its turn, timed from the turn less a round trip (as a request sent alone is timed). */
  observe(turn, t0, t1, nbytes) {
    const est = this.st.estimator;
    if (turn === null || turn.grantedT === null) {
      est.observe(nbytes, Math.max(t1 - t0, 1e-6));
      return t0;
    }
    const start = Math.max(t0, turn.grantedT - this.st.rttS);
    if (turn.after) est.observe(turn.after, Math.max(t1 - start, 1e-6));
    return start;
  }

  /** Until ``task`` (a shard's fetch; its ``done`` flag set at its end) has sent its request and the bytes requested
   *  and not received pass requestGate, or it has ended, or the wire turns out ungated. */
  async untilWindow(task, sent) {
    await Promise.race([task, sent]);
    while (!task.done && !this.ungated) {
      let left = 0;
      for (const t of this.turns) left += t.left;
      if (requestGate(this.st.estimator, this.st.rttS, left)[0]) return;
      await Promise.race([task, this._progress]);
    }
  }

  _wake() {
    const p = this._progress;
    this._progress = signal();
    p.set();
  }

  _acquire(turn) {
    if (this._holder === null) {
      this._holder = turn;
      return Promise.resolve();
    }
    return new Promise((r) => this._queue.push([turn, r]));
  }

  _release(turn) {
    if (this._holder !== turn) return;
    const next = this._queue.shift();
    this._holder = next ? next[0] : null;
    if (next) next[1]();
  }
}

/** One transfer's turn on the wire (the module comment); ``left``: its bytes not yet received. */
export class Turn {
  constructor(wire, g, size) {
    Object.assign(this, { wire, g, left: size });
    this.offered = false; // onChunk returned it
    this.held = false; // the fetcher awaited it
    this.closed = false;
    this.acquired = false; // it holds (or held) the wire
    this.grantedT = null; // when a transfer that waited for the wire got it
    this.after = 0; // its bytes received since (what the estimator is given: those before shared the wire)
    this._taken = null;
  }

  then(resolve, reject) { // awaited: every chunk after waits for the wire (the blobs of a chain share one turn)
    this.held = true;
    this._taken ??= this._take();
    return this._taken.then(resolve, reject);
  }

  async _take() {
    const st = this.wire.st;
    const queued = this.wire._holder !== null;
    const entry = st.receiving.get(this.g);
    if (queued && entry) entry[0] = QUEUED; // waiting: no transfer in progress to the policy (linkProgress)
    await this.wire._acquire(this);
    this.acquired = true;
    if (this.closed) { // ended (failed) while it waited: the wire goes on
      this.wire._release(this);
      return;
    }
    st.onWire = this.g; // the transfer the policy sees in progress
    if (queued) { // timed from its turn less the round trip, as the simulator times it
      this.grantedT = st.now;
      if (entry) entry[0] = this.grantedT - st.rttS;
    }
  }

  release() {
    this.closed = true;
    if (this.wire._holder !== this) return;
    const st = this.wire.st;
    if (st.onWire === this.g) st.onWire = null;
    this.wire._release(this);
  }
}
