// The fetch lane of the page (sakura_core/runtime/fetch_lane.py): the link, as the policy chooses. Whenever the link
// is free the policy is asked (at one frozen moment) about the next shard in execution order (choose: a level, "the
// device computes it", "not now" = deferred, or stop); a deferred shard is asked about again (worthAsking, then
// choose) before later shards and while the link would idle, until the compute lane reaches it; once every shard is
// decided, progressive upgrades on the idle link as the policy says (upgrade: only the refinement's blobs are
// fetched, the chain decoded again). A shard's chain's blobs are requested together (one round trip); its decode (the
// pool) overlaps the next transfer. Requests go ahead (requestAhead, as Python's RuntimeConfig.request_ahead;
// fetch_wire.js): the next shard's request leaves once the bytes requested and not yet received pass requestGate
// (lane_rules.js), so its round trip passes while the transfers before it arrive, and the transfers take the wire one
// at a time; without it, one shard at a time (the next request once this transfer has ended). Each transfer is
// streamed: its progress is the policy's linkProgress, its end an estimator sample. Per-step KV:
// a shard of a later step than the running one waits until the KV held for later steps, with the shards requested
// and not yet held, leaves room for it under the memory budget. A failed shard is retried at the floor, then left to
// the device. The compute lane asks for a shard it needs and the lane skipped through fetchSkipped(g) only.
// Cross-step levels (per-step templates; Python's fetch_lane.py): a level whose closed-loop twin's reference the
// device holds (HeldKV.closedTwin) is fetched as that twin, one below the open-loop floor off its track at that floor
// (ladder.js fetchAs); a residual decodes with its reference as the device holds it (HeldKV.referenceFor), waiting
// for the lane's own fetch of it or for the device to make it at its step's end; one whose reference the device
// neither holds nor will make is not fetched: its self-contained exact level is.
import { LEVEL_COMPUTE } from "../policy/index.js";
import { fetchAs } from "../policy/ladder.js";
import { Wire } from "./fetch_wire.js";
import { hasPrefetchRoom } from "./lane_rules.js";

export const IDLE_POLL_S = 0.02; // how often an idle lane asks again about deferred shards (seconds)

const chainOf = (rep) => [...(rep.requires ?? []), rep.digest];
/** How many of ``want``'s first blobs ``have`` holds already. */
function prefix(have, want) {
  let i = 0;
  while (i < have.length && i < want.length && have[i] === want[i]) i += 1;
  return i;
}

export class FetchLane {
  /** plan: pageLadders(); fetchBlob(digest, bytes, onChunk) -> Uint8Array; pool: a DecodePool; slotOf(g, rep): the
   *  shard's manifest slot; budgetBytes: the prefetch bound (per-step KV); shardBytes: one shard's float32 K/V;
   *  measured: the page session's MeasuredProfile, told each decode's seconds (null: none kept). */
  /** rttFromFirstByte: the link's round trip (st.rttS) becomes the first transfer's time to its first byte (a page
   *  whose manifest came earlier, maybe over another link, measures the edit's own link so). requestAhead: requests
   *  go ahead of the wire (fetchBlob must await what onChunk returns, as fetchShard does; one that does not turns it
   *  off, see ahead). */
  constructor({ plan, st, ctx, policy, held, pool, log, fetchBlob, slotOf, budgetBytes, shardBytes, timers, upgrades = true,
    rttFromFirstByte = false, requestAhead = true, measured = null }) {
    Object.assign(this, { plan, st, ctx, policy, held, pool, log, fetchBlob, slotOf, budgetBytes, shardBytes, timers, upgrades,
      rttFromFirstByte, requestAhead, measured });
    this.n = plan.ladders.length;
    this.reset();
  }

  reset() {
    this.bytesFetched = 0;
    this.deferred = [];
    this._deferredSig = null;
    this.stopped = false;
    this._claimed = new Set(); // shards with a fetch chosen and not ended
    this._requested = new Set(); // shards past their room check and not ended (counted in the room)
    this._fetches = new Set(); // this lane's fetches still running (transfer, then decode)
    this.chains = new Map(); // g -> {digests, blobs}: what a shard's KV was decoded from (an upgrade extends it)
    this.released = 0; // shards before this were served and freed (per-step KV)
    this._rttMeasured = !this.rttFromFirstByte;
    this.wire = new Wire(this.st); // requestAhead: the wire the lane's transfers take in turn
  }

  /** Whether the lane sends requests ahead of the wire (requestAhead, with a fetcher that awaits its turns). */
  get ahead() {
    return this.requestAhead && !this.wire.ungated;
  }

  async run() {
    const st = this.st;
    while (st.nextLayer < this.n && !this.stopped) {
      const pick = this._decide(true);
      if (pick === "stop") break;
      if (pick !== null) await this._fetchBase(...pick);
    }
    st.baseDone = true;
    let upgrades = this.upgrades;
    while (!this.stopped) {
      const pick = this._decide(false);
      if (pick !== null) {
        await this._fetchBase(...pick);
        continue;
      }
      if (upgrades) {
        const did = await this._upgradeOnce();
        if (did) continue;
        upgrades = did !== null && this._fetches.size > 0; // the shards on their way may want upgrades
      }
      if (!this.deferred.length && !upgrades) break;
      if (this.deferred.length || !this._fetches.size) await this.timers.sleep(IDLE_POLL_S);
      else await Promise.race(this._fetches);
    }
  }

  stop() {
    this.stopped = true;
  }

  /** One link decision at one frozen moment: [g, level] to fetch, null (nothing now) or "stop". */
  _decide(base) {
    const st = this.st;
    return st.frozen(() => {
      st.linkFree = st.now;
      const again = this._askDeferred();
      if (again !== null || !base) return again;
      const g = st.nextLayer;
      if (this.held.device.has(g)) { // a fallback template pass made its KV: not fetched
        st.nextLayer += 1;
        return null;
      }
      const d = this.policy.choose(this.ctx, g);
      this.log.decision(st.now, g, d.level, d.reason);
      if (d.level === null) return "stop";
      st.nextLayer += 1;
      if (d.level === LEVEL_COMPUTE) {
        if (d.defer) this.deferred.push(g);
        return null;
      }
      this._claimed.add(g);
      return [g, d.level];
    });
  }

  _signature() {
    const st = this.st;
    let done = 0;
    for (const v of st.got.values()) done += v.length;
    return [st.computeLayer, st.templateAlive, st.nextLayer, done, st.inFlight.size, st.estimator.samples].join(",");
  }

  /** ask_deferred (runtime/deferral.py): the first deferred shard not reached that the policy now wants. */
  _askDeferred() {
    const st = this.st;
    this.deferred = this.deferred.filter((g) => !this.held.device.has(g) && g >= st.computeLayer + 1);
    if (!this.deferred.length) return null;
    const sig = this._signature();
    if (sig === this._deferredSig) return null;
    for (const g of this.policy.worthAsking(this.ctx, [...this.deferred])) {
      const d = this.policy.choose(this.ctx, g);
      if (d.level === null || d.level === LEVEL_COMPUTE) {
        if (!d.defer) this.deferred = this.deferred.filter((x) => x !== g);
        continue;
      }
      this.deferred = this.deferred.filter((x) => x !== g);
      this._deferredSig = null;
      this._claimed.add(g);
      this.log.decision(st.now, g, d.level, d.reason);
      return [g, d.level];
    }
    this._deferredSig = sig;
    return null;
  }

  async _upgradeOnce() {
    const st = this.st;
    const up = st.frozen(() => {
      st.linkFree = st.now;
      return this.policy.upgrade(this.ctx);
    });
    if (up === null) return false;
    const [g, level] = up;
    await this._roomFor(g);
    this.log.decision(st.now, g, level, "upgrade", "upgrade");
    try {
      await this._fetchLevel(g, level);
    } catch (e) {
      this.log.fallback(`upgrade of shard ${g} to ${this.plan.ladders[g][level].name} failed: ${e.message}`);
      return null;
    }
    return true;
  }

  /** The compute lane needs shard g, which this lane skipped: fetched now at the floor. False when it was not
   *  skipped (chosen, in flight, decoded, or not decided yet). */
  fetchSkipped(g) {
    const st = this.st;
    if (this._claimed.has(g) || st.inFlight.has(g) || (st.got.get(g) ?? []).length || this.held.isReady(g)) return false;
    if (!(st.baseDone || st.nextLayer > g)) return false;
    this.deferred = this.deferred.filter((x) => x !== g);
    this._claimed.add(g);
    // not gated: the compute lane waits for it, it does not queue for the wire
    this._track(this._withFallback(g, this.plan.floor[g], false).finally(() => this._claimed.delete(g)));
    return true;
  }

  _track(promise) {
    const p = promise.finally(() => this._fetches.delete(p));
    this._fetches.add(p);
    return p;
  }

  /** Per-step KV under a budget: a later step's shard waits for room (the running step's never waits). */
  async _roomFor(g) {
    if (!this.plan.perStep || this.budgetBytes === null) return;
    while (!this.stopped) {
      const end = this.held.runningEnd;
      if (g < end || this.held.isReady(g)) return;
      let coming = 0;
      for (const x of this._requested) if (x >= end && !this.held.isReady(x)) coming += 1;
      const later = this.held.heldFrom(end) + coming * this.shardBytes;
      if (hasPrefetchRoom(g, end, later, this.shardBytes, this.budgetBytes)) return;
      await this.timers.sleep(IDLE_POLL_S);
    }
  }

  /** A shard the policy chose: fetched once there is room for it; returns once its transfer has ended (its decode
   *  goes on beside the next transfer) or, with ahead, once its request has left and the bytes requested ahead pass
   *  requestGate (before the estimator's first sample there is no window: the probe's transfer ends first). */
  async _fetchBase(g, level) {
    const ahead = this.ahead;
    const { sent, landed } = this.wire.expect(g);
    const task = this._track((async () => {
      try {
        await this._roomFor(g);
        if (this.stopped) return;
        this._requested.add(g);
        const lv = this.plan.ladders[g][level];
        const st = this.st;
        st.inFlight.set(g, st.now + this.ctx.rttS + lv.nbytes / st.estimator.robust() + lv.decodeS);
        await this._withFallback(g, level);
      } finally {
        this._claimed.delete(g);
        this._requested.delete(g);
      }
    })());
    task.done = false;
    const ended = () => { task.done = true; };
    task.then(ended, ended);
    try {
      if (ahead) await this.wire.untilWindow(task, sent);
      if (!task.done && !this.ahead) await Promise.race([task, landed]); // one request at a time
    } finally {
      this.wire.forget(g);
    }
  }

  /** gated: with ahead, the transfer takes its turn on the wire (_fetchLevel). */
  async _withFallback(g, level, gated = true) {
    try {
      await this._fetchLevel(g, level, gated);
    } catch (e) {
      const reps = this.plan.reps[g];
      const top = (reps[reps.length - 1].ref ?? null) === null ? reps.length - 1 : null; // ladder.py self_contained_top
      const retry = e.name === "MissingReferenceError" ? top : this.plan.floor[g];
      let err = e;
      if (retry !== null && level !== retry) {
        const what = retry === this.plan.floor[g] ? "the floor level" : "its self-contained exact level";
        this.log.fallback(`shard ${g} level ${this.plan.ladders[g][level].name}: ${e.message}; retrying at ${what}`);
        try {
          await this._fetchLevel(g, retry, gated);
          return;
        } catch (e2) {
          err = e2;
        }
      }
      this.log.fallback(`shard ${g}: ${err.message}; the device computes this layer's template KV`);
      this.log.decision(this.st.now, g, "device", `shard ${g} could not be fetched (${err.name})`, "device");
      this.st.inFlight.delete(g);
      this.held.fail(g);
    }
  }

  /** Fetch the chain of shard g up to ``level`` (the blobs its held chain lacks), decode it in the pool, publish.
   *  gated and ahead: the chain's bytes wait for the wire (one turn for the shard, fetch_wire.js). */
  async _fetchLevel(g, levelAsked, gated = true) {
    const st = this.st;
    let level = levelAsked;
    let rep = this.plan.reps[g][level];
    const have = this.chains.get(g) ?? { digests: [], blobs: [], reference: null };
    let start = prefix(have.digests, chainOf(rep));
    if (!start) { // a closed-loop twin on its track, or off it the open-loop floor (policy/ladder.js fetchAs)
      await this._referenceFetched(g, rep);
      const twin = this.held.closedTwin(g, rep);
      let asTwin;
      [level, asTwin] = fetchAs(this.plan.ladders[g], level, twin !== null);
      rep = asTwin && twin !== null ? twin : this.plan.reps[g][level];
      start = prefix(have.digests, chainOf(rep));
    }
    const name = rep.name;
    const digests = chainOf(rep);
    let reference = have.reference; // an upgrade decodes against the reference its chain was decoded against
    let coming = false; // the reference is made on the device (or fetched) by the end of its step: decoded then
    if (!start) {
      try {
        reference = this.held.referenceFor(g, rep);
      } catch (e) {
        coming = e.name === "MissingReferenceError" && this._referenceComing(g, rep);
        if (!coming) throw e;
      }
    }
    const sizes = new Map([...this.plan.reps[g], rep].map((r) => [r.digest, r.bytes]));
    const todo = digests.slice(start);
    const entry = [st.now, 0, todo.reduce((s, d) => s + sizes.get(d), 0)];
    st.receiving.set(g, entry);
    let fresh;
    const turn = gated && this.ahead ? this.wire.open(g, entry[2]) : null;
    const t0 = st.now;
    try { // the chain's blobs requested together: one round trip for the shard, as the policy plans it (queuedRttS)
      const onChunk = (n) => {
        if (!this._rttMeasured) { this._rttMeasured = true; st.rttS = Math.min(st.now - t0, 1.0); }
        entry[1] += n;
        return turn === null ? undefined : this.wire.received(turn, n); // the fetcher awaits its turn
      };
      fresh = await Promise.all(todo.map((d) => this.fetchBlob(d, sizes.get(d), onChunk)));
    } finally {
      if (turn !== null) this.wire.close(turn);
      st.receiving.delete(g);
    }
    const t1 = st.now;
    const nbytes = fresh.reduce((s, b) => s + b.byteLength, 0);
    const began = this.wire.observe(turn, t0, t1, nbytes); // one transfer: the shard's bytes over its time
    this.bytesFetched += nbytes;
    this.log.event("fetch", began, t1, g, name);
    if (st.inFlight.has(g)) st.inFlight.set(g, st.now + this.plan.ladders[g][level].decodeS);
    this.wire.landed(g); // the link may go on (one request at a time): this shard's transfer has ended
    const blobs = [...have.blobs.slice(0, start), ...fresh];
    if (coming) reference = await this._heldReference(g, rep);
    const d0 = st.now;
    const kv = await this.pool.decode(blobs, this.slotOf(g, rep), reference);
    this.log.event("decode", d0, st.now, g, name);
    this.measured?.observeDecode(name, this.shardBytes / 2, st.now - d0); // the next edit plans with this rate
    if (this.stopped || g < this.released) return; // the edit is over, or the compute lane passed the shard
    this.chains.set(g, { digests, blobs, reference });
    this.held.publish(st.now, g, { k: kv.k, v: kv.v, level, name, digest: digests[digests.length - 1] });
    if (!st.got.has(g)) st.got.set(g, []);
    st.got.get(g).push([level, st.now]);
    st.inFlight.delete(g);
    st.decoderFree = st.now;
  }

  /** The reference shard of ``rep`` (a cross-step level or its twin) of shard g, or null. */
  _refShard(g, rep) {
    const ref = rep.ref ?? rep.closedTwin?.ref ?? null;
    return ref === null || ref.mode === "reuse" ? null : ref.step * this.plan.layers + (g % this.plan.layers);
  }

  /** The lane's own fetch of the reference of ``rep`` still under way: waited for (the level, or its twin, is
   *  chosen against the reference the device will hold; reference_wait.py fetched). */
  async _referenceFetched(g, rep) {
    const x = this._refShard(g, rep);
    if (x !== null && this._claimed.has(x) && !this.held.isReady(x)) await this.held.waitReady(x);
  }

  /** The reference of ``rep`` will be held: the compute lane has not finished its step (each layer of a step is
   *  fetched, or made on the device and kept at the step's end) and has not passed shard g. */
  _referenceComing(g, rep) {
    const ref = rep.ref;
    const L = this.plan.layers;
    return ref !== null && ref !== undefined && Math.floor(this.st.computeLayer / L) <= ref.step && g >= this.released;
  }

  /** The reference _referenceComing said will come, once held; MissingReferenceError once the compute lane has
   *  finished its step without it (or the edit is over). */
  async _heldReference(g, rep) {
    for (;;) {
      try {
        return this.held.referenceFor(g, rep);
      } catch (e) {
        if (e.name !== "MissingReferenceError" || this.stopped || !this._referenceComing(g, rep)) throw e;
      }
      await this.timers.sleep(IDLE_POLL_S);
    }
  }

  /** Per-step KV: shards before g served their step: their chains are dropped (never upgraded again). */
  releaseBefore(g) {
    this.released = Math.max(this.released, g);
    for (const x of [...this.chains.keys()]) if (x < g) this.chains.delete(x);
  }
}
