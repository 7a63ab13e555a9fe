// The compute costs the page measures (the policy's profile, policy/context.js): a DiT step's seconds and a template-
// pass layer's seconds, the medians of the latest few of each; and its decode rate per level name (a shard's fp16 K/V
// bytes over the decode lane's seconds), which the next edit's ladders take as their levels' decodeS (ladders.js).
// A page keeps one for its session (made at model load) and hands it to every edit, so an edit's policy plans with
// the device's measured costs from its first decision (not a guess); an edit given none starts from DEFAULT_LAYER_S a layer and measures as it runs. The profile the
// policy reads follows LiveProfile (sakura_core/runtime/live_profile.py): a cached layer is a DiT step over the
// layers, a full layer that plus a template-pass layer, the template pass every layer's pass seconds.

export const DEFAULT_LAYER_S = 0.05; // the cached-layer time planned with before anything is measured (s)
export const NO_PASS_S = 1e6; // the template's cost where the device cannot compute it (no template pass)
export const KEEP_SAMPLES = 5; // the latest measurements each median is taken over

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/** The profile planned with before anything is measured (DEFAULT_LAYER_S a layer; the pass as dear as a step). */
export function initialProfile(layers, steps, hasPass, layerS = DEFAULT_LAYER_S) {
  return { layerFullS: hasPass ? 2 * layerS : NO_PASS_S, layerCachedS: layerS,
    templatePassS: hasPass ? layers * layerS : NO_PASS_S, fixedS: 0.0, steps, ditCpuCores: 1 };
}

export class MeasuredProfile {
  constructor() { this.reset(); }

  reset() {
    this.stepS = []; // the latest DiT steps' seconds
    this.passLayerS = []; // the latest template-pass layers' seconds
    this.decodeRate = new Map(); // level name -> the latest decodes' fp16 K/V bytes per second
  }

  get measured() { return this.stepS.length > 0 || this.passLayerS.length > 0; }

  observeStep(s) { this._keep(this.stepS, s); }
  observePassLayer(s) { this._keep(this.passLayerS, s); }

  /** A decode of a level `name` shard: `fp16Bytes` of K/V (fp16) in `s` seconds of the decode lane. */
  observeDecode(name, fp16Bytes, s) {
    if (!(fp16Bytes > 0)) throw new RangeError(`a decoded shard's fp16 bytes must be > 0, got ${fp16Bytes}`);
    if (!(s > 0)) return; // a decode the clock could not time (0 s) says nothing of the rate
    if (!this.decodeRate.has(name)) this.decodeRate.set(name, []);
    this._keep(this.decodeRate.get(name), fp16Bytes / s);
  }

  /** {level name: the median measured decode rate (fp16 bytes/s)} of the levels decoded so far. */
  decodeRates() {
    return Object.fromEntries([...this.decodeRate].map(([name, rates]) => [name, median(rates)]));
  }

  _keep(list, s) {
    if (!(s >= 0)) throw new RangeError(`a measured compute time must be >= 0 seconds, got ${s}`);
    list.push(s);
    if (list.length > KEEP_SAMPLES) list.shift();
  }

  /** A fresh profile for an edit of `layers` x `steps`: what is measured, the initial guess for the rest. */
  profileFor(layers, steps, hasPass) {
    const p = initialProfile(layers, steps, hasPass);
    this.applyTo(p, layers, hasPass);
    return p;
  }

  /** Write what is measured into the profile `p` the policy reads (in place: the policy sees it at its next call). */
  applyTo(p, layers, hasPass) {
    if (this.stepS.length) p.layerCachedS = median(this.stepS) / layers;
    if (hasPass && this.passLayerS.length) {
      const pass = median(this.passLayerS);
      p.layerFullS = p.layerCachedS + pass;
      p.templatePassS = pass * layers;
    } else if (hasPass) {
      p.layerFullS = 2 * p.layerCachedS;
      p.templatePassS = p.layerCachedS * layers;
    }
  }
}
