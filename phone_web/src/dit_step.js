// One edit's DiT steps on onnxruntime-web (the sakura_core.runtime.denoise.run_edit loop, the exported graph of
// android_bridge/web_export.py): the inputs outside the graph formed once (prompt embedding, rope tables, seeded
// noise, the photo's patches), then each step one run of the graph with every layer's template K/V and an Euler
// update of the latent in float32. The fixed-level edit (edit.js) and the page's lanes (lanes/page_edit.js) share it.
import { encodePrompt, flowTimes, packImage, timeFeatures, torchRandn, unpackTokens } from "./web_model.js";

const f = Math.fround;

export class DitSteps {
  /** model: loadWebModel's; run: createSession's; rgba: the photo (image_size^2 RGBA bytes). */
  constructor({ model, run, rgba, prompt, steps, seed }) {
    const { index, tables } = model;
    this.index = index;
    this.ort = run.ort;
    this.session = run.session;
    this.n = index.image_tokens;
    this.pd = index.in_channels / 2;
    this.user = packImage(rgba, index);
    this.times = flowTimes(steps);
    this.x = torchRandn(seed, this.n * this.pd);
    this.tables = tables;
    const txt = encodePrompt(prompt, index, tables.byte_table);
    const S = index.text_tokens + this.n;
    this.fixed = { // the inputs every step shares: [data, dims]
      txt: [txt, [1, index.text_tokens, txt.length / index.text_tokens]],
      rope_cos: [tables.rope_cos, [S, index.head_dim]],
      rope_sin: [tables.rope_sin, [S, index.head_dim]],
    };
    this.feeds = {};
    this.tokens = new Float32Array(this.n * 2 * this.pd);
  }

  /** A float32 tensor; with ORT's proxy worker (env.wasm.proxy) over a copy, as the proxy detaches what it sends. */
  tensor(data, dims) { return new this.ort.Tensor("float32", this.ort.env.wasm.proxy ? data.slice() : data, dims); }

  /** Step ``step`` with ``kv[l] = {k, v}`` (float32, (template tokens, heads, head_dim)) for every layer. */
  async step(step, kv) {
    const { n, pd, index, x, user, tokens, feeds } = this;
    for (let i = 0; i < n; i++) {
      tokens.set(x.subarray(i * pd, (i + 1) * pd), i * 2 * pd);
      tokens.set(user.subarray(i * pd, (i + 1) * pd), i * 2 * pd + pd);
    }
    feeds.x = this.tensor(tokens.slice(), [1, n, 2 * pd]);
    const templateTokens = kv[0].k.length / (index.heads * index.head_dim);
    const dims = [1, templateTokens, index.heads, index.head_dim]; // (1, template tokens: every reference's, heads, hd)
    kv.forEach(({ k, v }, l) => {
      feeds[`k_ref_${l}`] = this.tensor(k, dims);
      feeds[`v_ref_${l}`] = this.tensor(v, dims);
    });
    for (const [name, [data, dims]] of Object.entries(this.fixed)) if (!(name in feeds) || this.ort.env.wasm.proxy) feeds[name] = this.tensor(data, dims);
    feeds.t_freq = this.tensor(timeFeatures(this.times[step], this.tables.time_freqs), [1, this.tables.time_freqs.length * 2]);
    const v = (await this.session.run(feeds))[index.graph.output].data;
    for (const l of kv.keys()) { // the step's K/V leave the feeds once it is done (per-step KV is freed)
      delete feeds[`k_ref_${l}`];
      delete feeds[`v_ref_${l}`];
    }
    const dt = f(this.times[step + 1] - this.times[step]);
    for (let i = 0; i < x.length; i++) x[i] = f(x[i] + f(dt * v[i]));
  }

  /** The edited image, RGBA bytes. */
  rgba() { return unpackTokens(this.x, this.index); }
}
