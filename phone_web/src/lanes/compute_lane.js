// The compute lane of the page (sakura_core/runtime/compute_lane.py and late_shards.py): the edit, step by step. At
// each step where the template runs (step 0 in single-KV mode, every step in per-step mode, every step for
// on-device) the device computes the template's K/V layer by layer with the template pass (template_pass.js) while
// the policy keeps it (keepTemplate per layer; on-device always): the split. The layers after the drop take the
// fetched shards; a shard not decoded yet is waited for (a stall), asking the policy every cached-layer time whether
// resuming the template pass where the step dropped it is sooner (recomputeLate); if so the pass runs on, layer by
// layer, until every shard the step still needs is decoded or made by it. Then the DiT step runs (onnxruntime-web on
// this thread) with every layer's K/V; per-step KV of a done step is freed at once. Without a template pass (model
// files with no per-layer template graphs) the template is dropped before layer 0: every layer is fetched.

export const LATE_FALLBACK_REASON = "shards late: template pass on the device is sooner"; // runtime/deferral.py

export class ComputeLane {
  /** computeStep(step, kv) runs one DiT step with kv[l] = {k, v}; templatePass: a TemplatePass or null;
   *  templateTokens(): the template's packed tokens (a promise); times: the flow times (per-step pass times);
   *  measured: a MeasuredProfile, fed each DiT step and template-pass layer (the policy's profile follows it). */
  constructor({ plan, st, ctx, policy, held, fetch, log, computeStep, templatePass, templateTokens, times, steps,
    shardWaitS = 120, measured }) {
    Object.assign(this, { plan, st, ctx, policy, held, fetch, log, computeStep, templatePass, templateTokens, times, steps, shardWaitS, measured });
    this.L = plan.layers;
    this.reset();
  }

  reset() {
    this.levelsUsed = []; // per step, per layer: "template", "device" or the level name fetched
    this.splitLayers = []; // per step: the layer the template was dropped at (L: kept throughout)
    this.stepS = [];
    this._run = null; // the template pass of the running step (kept for a resume until the step ends)
    this._deviceKV = []; // single mode: the layers step 0's pass made (every later step reuses them)
  }

  async run() {
    for (let step = 0; step < this.steps; step++) {
      const s0 = this.st.now;
      const kv = new Array(this.L).fill(null);
      this._enterStep(step);
      this.levelsUsed.push(new Array(this.L).fill(null));
      const templateStep = this.plan.perStep || step === 0 || this.policy.templateEveryStep;
      if (templateStep) await this._templatePhase(step, kv);
      else this._reuseDevice(step, kv);
      await this._cachedPhase(step, kv);
      const t0 = this.st.now;
      await this.computeStep(step, kv);
      this.log.event("compute", t0, this.st.now, this._g(step, this.L - 1), "step");
      if (this._run !== null) this._run.dispose();
      this._run = null;
      if (this.plan.perStep) this._keepReferences(step, kv);
      this.stepS.push(this.st.now - s0);
      this.measured.observeStep(this.st.now - t0);
      this._profile();
      if (this.plan.perStep) this._release((step + 1) * this.L);
    }
  }

  _g(step, layer) { return this.plan.perStep ? step * this.L + layer : layer; }

  _enterStep(step) {
    const st = this.st;
    st.computeLayer = this._g(step, 0);
    st.computeT = st.now;
    if (this.plan.perStep || step === 0) {
      st.templateAlive = this.templatePass !== null;
      st.droppedAt = this.templatePass !== null ? this.L : 0;
    }
    this.held.setRunningEnd(st.now, this.plan.perStep ? (step + 1) * this.L : this.plan.ladders.length);
  }

  /** What is measured (this edit's steps and pass layers, and the page session's before) becomes the costs the
   *  policy plans with: a cached layer, a full layer and the template pass (its LiveProfile, measured live). */
  _profile() {
    this.measured.applyTo(this.st.profile, this.L, this.templatePass !== null);
  }

  async _templatePhase(step, kv) {
    const st = this.st;
    if (this.templatePass === null) { // nothing to run the template with: every layer fetched
      this.splitLayers.push(0);
      return;
    }
    const every = this.policy.templateEveryStep;
    for (let l = 0; l < this.L; l++) {
      const g = this._g(step, l);
      st.computeLayer = g;
      st.computeT = st.now;
      const keep = every || st.frozen(() => this.policy.keepTemplate(this.ctx, g));
      if (!keep) {
        st.templateAlive = false;
        st.droppedAt = l;
        this.log.decision(st.now, g, "drop", this.plan.perStep ? `template dropped at step ${step} layer ${l}` : `template dropped at layer ${l}`, "keep_template");
        this.splitLayers.push(l);
        return;
      }
      kv[l] = await this._passLayer(step, l, "template");
      this.levelsUsed[step][l] = "template";
    }
    this.splitLayers.push(this.L);
    if (!this.plan.perStep) st.templateAlive = every; // single mode: the template is done after step 0
  }

  /** The next layer of this step's template pass (begun on first use): its {k, v}, timed as a compute event. */
  async _passLayer(step, layer, level) {
    if (this._run === null) {
      const tokens = await this.templateTokens();
      this._run = await this.templatePass.begin(tokens, this.plan.perStep ? this.times[step] : null);
    }
    if (this._run.nextLayer !== layer) throw new Error(`the template pass is at layer ${this._run.nextLayer}, the step needs layer ${layer}`);
    const t0 = this.st.now;
    const out = await this._run.next();
    this.measured.observePassLayer(this.st.now - t0);
    this._profile();
    this.log.event("compute", t0, this.st.now, this._g(step, layer), level);
    const kv = { k: out.k, v: out.v };
    if (!this.plan.perStep) this._deviceKV[layer] = kv;
    return kv;
  }

  _reuseDevice(step, kv) {
    this._deviceKV.forEach((x, l) => {
      if (x) {
        kv[l] = x;
        this.levelsUsed[step][l] = "template";
      }
    });
  }

  async _cachedPhase(step, kv) {
    for (let l = 0; l < this.L; l++) {
      if (kv[l] !== null) continue;
      const g = this._g(step, l);
      this.st.computeLayer = g;
      this.st.computeT = this.st.now;
      if (!this.held.isReady(g) && !this.held.device.has(g)) await this._waitFor(g, step, l);
      if (this.held.device.has(g)) {
        kv[l] = this.held.device.get(g);
        this.levelsUsed[step][l] = "device";
      } else if (this.held.isReady(g)) {
        const e = this.held.kv.get(g);
        kv[l] = e;
        this.levelsUsed[step][l] = e.name;
      } else {
        const why = this.log.fallbacks.filter((x) => x.startsWith(`shard ${g}`)).pop() ?? "no fetch of it ended";
        throw new Error(`shard ${g} (step ${step} layer ${l}) could not be fetched (${why}) and this model's files have ` +
          "no per-layer template graphs to compute it (export the model again with them, or try again)");
      }
    }
  }

  /** A stall: wait for shard g, racing a resumed template pass when the policy finds it sooner. */
  async _waitFor(g, step, layer) {
    const st = this.st;
    this.fetch.fetchSkipped(g);
    const t0 = st.now;
    st.waitingSince = t0;
    const pollS = Math.min(Math.max(st.profile.layerCachedS, 0.01), this.shardWaitS);
    let late = false;
    try {
      for (;;) {
        if (await this.held.waitReady(g, pollS)) break;
        if (this.held.isFailed(g)) {
          late = this.templatePass !== null;
          break;
        }
        if (st.now - t0 >= this.shardWaitS) {
          this.log.fallback(`shard ${g} not ready after ${this.shardWaitS} s`);
          late = this.templatePass !== null;
          break;
        }
        if (this.templatePass !== null) {
          late = st.frozen(() => {
            st.computeT = st.now;
            return this.policy.recomputeLate(this.ctx, g);
          });
          if (late) {
            this.log.decision(st.now, g, "device", LATE_FALLBACK_REASON, "recompute_late");
            break;
          }
        }
      }
    } finally {
      st.stallsDoneS += st.now - t0;
      st.waitingSince = null;
      this.log.event("stall", t0, st.now, g, `step ${step}`);
    }
    if (late) await this._resumePass(step, layer);
  }

  /** The template pass resumed where the step dropped it (begun afresh if it never ran), layer by layer, until every
   *  shard the step still needs from ``late`` on is decoded or made by it (deferral.py pass_can_stop). */
  async _resumePass(step, late) {
    const end = this.L;
    const canStop = () => {
      for (let l = late; l < end; l++) {
        const g = this._g(step, l);
        if (!this.held.isReady(g) && !this.held.device.has(g)) return false;
      }
      return true;
    };
    if (this._run === null) {
      const tokens = await this.templateTokens();
      this._run = await this.templatePass.begin(tokens, this.plan.perStep ? this.times[step] : null);
    }
    while (this._run.nextLayer < end && !canStop()) {
      const l = this._run.nextLayer;
      const kv = await this._passLayer(step, l, "template (late)");
      const g = this._g(step, l);
      if (l >= late && !this.held.isReady(g)) this.held.holdDevice(this.st.now, g, kv);
    }
  }

  /** The layers of ``step`` the device computed (template pass): kept while a later step's level references them. */
  _keepReferences(step, kv) {
    const made = new Map();
    this.levelsUsed[step].forEach((n, l) => { if (n === "template" && kv[l] !== null) made.set(this._g(step, l), kv[l]); });
    this.held.keepReferences(this.st.now, made);
  }

  /** Per-step KV: the shards before g served their step: freed (KV, chains). */
  _release(g) {
    this.held.releaseBefore(this.st.now, g);
    this.fetch.releaseBefore(g);
  }
}
