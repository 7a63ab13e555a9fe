// The template-only pass on the page, layer by layer (android_bridge/web_template_layers.py's graphs): the embed graph
// turns the packed template tokens into the hidden state entering layer 0, then one graph per layer gives that
// layer's K/V and the hidden state entering the next, the template modulated at the reference time (single KV mode)
// or at a step's own flow time (per-step KV mode). A run pauses between any two layers and resumes where it stopped
// (sakura_core/models/flux2_template.py resume_template_kv; runtime/pipeline.py's "resume where the step dropped
// the template tokens"), so the page's lanes can split at any layer and race a late shard.
import { fetchChecked, timeFeatures } from "./web_model.js";

/** The per-layer template pass of the model files at ``base`` (index: their model.json; ``ort``: onnxruntime-web;
 * ``providers``: its executionProviders, e.g. ["wasm"]); null when the export has no per-layer graphs. */
export async function loadTemplatePass({ base, index, ort, providers }) {
  const t = index.template_layers ?? null;
  if (t === null) return null;
  if (t.layers.length !== index.layers) throw new Error(`the index lists ${t.layers.length} template layer graphs for a model of ${index.layers} layers: export the model again`);
  const session = async (entry, what) => ort.InferenceSession.create(await fetchChecked(`${base}${entry.file}`, entry, what),
    { executionProviders: providers });
  const bytes = await fetchChecked(`${base}${index.tables.time_freqs.file}`, index.tables.time_freqs, "table time_freqs");
  const freqs = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  const embed = await session(t.embed, "the template embed graph");
  const layers = [];
  for (const entry of t.layers) layers.push(await session(entry, `the template graph of layer ${entry.layer}`));
  return new TemplatePass(index, ort, embed, layers, freqs);
}

/** The graphs' sessions; ``begin`` starts one pass over a template. */
export class TemplatePass {
  constructor(index, ort, embed, layers, freqs) {
    this.layers = index.layers;
    this.index = index;
    this.ort = ort;
    this.embed = embed;
    this.sessions = layers;
    this.freqs = freqs;
  }

  /** A pass over ``tokens`` (Float32Array (1, template tokens, in_channels): patch, then zeros) modulated at ``time``
   * (null: the reference time, single KV mode; else a step's flow time, per-step KV mode). */
  async begin(tokens, time) {
    const { image_tokens: n, in_channels: c } = this.index;
    if (!(tokens instanceof Float32Array) || tokens.length !== n * c) {
      throw new Error(`template tokens must be a Float32Array of ${n} x ${c} values (one reference, packed patch then zeros), got ${tokens?.length}`);
    }
    const t = time === null ? this.index.template_layers.ref_timestep : time;
    if (!(t >= 0 && t <= 1)) throw new Error(`the template's time must be in [0, 1] (or null for the reference time), got ${time}`);
    const proxied = this.ort.env.wasm?.proxy === true; // ORT's proxy worker detaches what it sends: send copies
    const out = await this.embed.run({ template: new this.ort.Tensor("float32", proxied ? tokens.slice() : tokens, [1, n, c]) });
    const tFreq = new this.ort.Tensor("float32", timeFeatures(t, this.freqs), [1, this.freqs.length * 2]);
    return new PassRun(this, out.hidden, tFreq);
  }
}

/** One pass under way: ``next()`` computes layer ``nextLayer`` and advances; stop calling it to pause, call it again
 * to resume from the hidden state it kept. */
export class PassRun {
  constructor(pass, hidden, tFreq) {
    this.pass = pass;
    this.hidden = hidden; // ORT tensor (1, template tokens, dim): the hidden state entering nextLayer
    this.tFreq = tFreq;
    this.nextLayer = 0;
    this.queue = Promise.resolve(); // next() calls run one after another, in the order they were made
  }

  /** -> {layer, k, v}: layer ``nextLayer``'s K/V, each Float32Array (tokens, heads, head_dim). */
  next() {
    const step = this.queue.then(() => this.#layer());
    this.queue = step.catch(() => {});
    return step;
  }

  async #layer() {
    const layer = this.nextLayer;
    if (this.hidden === null) throw new Error(`this template pass was disposed (at layer ${layer})`);
    if (layer >= this.pass.layers) throw new Error(`the template pass is done: all ${this.pass.layers} layers computed`);
    const hidden = this.hidden;
    const { ort } = this.pass;
    const tFreq = ort.env.wasm?.proxy === true ? new ort.Tensor("float32", this.tFreq.data.slice(), this.tFreq.dims) : this.tFreq;
    const out = await this.pass.sessions[layer].run({ hidden, t_freq: tFreq }); // (the proxy detaches hidden: used once)
    if (this.hidden !== hidden) { // disposed while the layer ran (a lane abandoned the pass): nothing kept
      for (const t of Object.values(out)) t.dispose();
      throw new Error(`this template pass was disposed while layer ${layer} ran`);
    }
    hidden.dispose();
    this.hidden = out.hidden_next;
    this.nextLayer = layer + 1;
    const k = out.k.data;
    const v = out.v.data;
    out.k.dispose();
    out.v.dispose();
    return { layer, k, v };
  }

  /** Frees the hidden state and the time features; next() then fails. */
  dispose() {
    this.hidden?.dispose();
    this.tFreq?.dispose();
    this.hidden = null;
    this.tFreq = null;
  }
}
