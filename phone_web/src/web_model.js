// The exported web model (android_bridge/web_export.py, `sakura export --target web`): its index, tables and graph
// fetched from the server (digests checked with WebCrypto), an onnxruntime-web session over the graph with the
// first execution provider that works (WebNN npu -> WebGPU -> WASM; which one ran and why the others did not is
// kept), and the pure arithmetic of the demo model outside the graph (sakura_core/models/edit_model.py), in float32
// the way torch does it: prompt bytes, timestep features, schedule, seeded noise, pixel patches.
import { sha256Hex } from "./digest.js";

const f = Math.fround;
export const WEB_FORMAT = "sakura-web-model/1";

async function getBytes(url, what) {
  const answer = await fetch(url);
  if (!answer.ok) {
    const said = await answer.json().then((j) => j.error, () => null); // the server's error says how to fix it
    throw new Error(`${what}: ${url} answered ${answer.status}${said ? `: ${said}` : ""}`);
  }
  return new Uint8Array(await answer.arrayBuffer());
}

/** The bytes at ``url``, checked against the index entry's SHA-256 (``what`` names them in errors). */
export async function fetchChecked(url, entry, what) {
  const bytes = await getBytes(url, what);
  const digest = await sha256Hex(bytes);
  if (digest !== entry.sha256) throw new Error(`${what}: SHA-256 ${digest} is not the index's ${entry.sha256}`);
  return bytes;
}

/** model.json and every file it names, from ``base`` (e.g. "/phone/model/"): the tables, the cached-KV graph and
 * the template graph of the hybrid split (null when the export has none). */
export async function loadWebModel(base, onProgress = () => {}) {
  const index = JSON.parse(new TextDecoder().decode(await getBytes(`${base}model.json`, "the model index")));
  if (index.format !== WEB_FORMAT) throw new Error(`the model index is ${index.format}, this page reads ${WEB_FORMAT}`);
  const tables = {};
  for (const [name, entry] of Object.entries(index.tables)) {
    const bytes = await fetchChecked(`${base}${entry.file}`, entry, `table ${name}`);
    tables[name] = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    const want = entry.shape.reduce((a, b) => a * b, 1);
    if (tables[name].length !== want) throw new Error(`table ${name}: ${tables[name].length} values, not ${want}`);
  }
  onProgress("model", 1, 2);
  const graph = await fetchChecked(`${base}${index.graph.file}`, index.graph, "the DiT graph");
  const t = index.template_graph ?? null;
  const templateGraph = t === null ? null : await fetchChecked(`${base}${t.file}`, t, "the template graph");
  onProgress("model", 2, 2);
  return { index, tables, graph, templateGraph };
}

/** An InferenceSession over ``graph`` with the first provider that works among ``order``; ``{session, ep, tried}``. */
export async function createSession(loadOrt, graph, order = ["webnn", "webgpu", "wasm"]) {
  const tried = [];
  for (const ep of order) {
    let why = null;
    if (ep === "webnn" && !("ml" in navigator)) why = "navigator.ml is absent (no WebNN in this browser)";
    if (ep === "webgpu") {
      if (!("gpu" in navigator)) why = "navigator.gpu is absent";
      else if ((await navigator.gpu.requestAdapter().catch(() => null)) === null) why = "no WebGPU adapter";
    }
    if (why === null) {
      try {
        const ort = await loadOrt(ep);
        const options = ep === "webnn" ? [{ name: "webnn", deviceType: "npu" }] : [ep];
        const session = await ort.InferenceSession.create(graph, { executionProviders: options });
        tried.push({ ep, ok: true });
        return { session, ep, ort, tried };
      } catch (e) {
        why = `${e.name}: ${e.message}`.slice(0, 300);
      }
    }
    tried.push({ ep, ok: false, why });
  }
  throw new Error(`no execution provider could run the model: ${tried.map((t) => `${t.ep} (${t.why})`).join("; ")}`);
}

/** (text_tokens * joint_dim) prompt embedding: lower-case UTF-8 bytes, one byte-table row each, zero padding. */
export function encodePrompt(prompt, index, byteTable) {
  const dim = byteTable.length / 256;
  const bytes = new TextEncoder().encode(prompt.toLowerCase()).slice(0, index.text_tokens);
  const out = new Float32Array(index.text_tokens * dim);
  bytes.forEach((b, i) => out.set(byteTable.subarray(b * dim, (b + 1) * dim), i * dim));
  return out;
}

/** ``steps + 1`` flow times from 1 to 0 as torch.linspace(1, 0, steps + 1) computes them in float32. */
export function flowTimes(steps) {
  const n = steps + 1;
  const step = f(-1 / steps);
  const half = Math.floor(n / 2);
  return Float32Array.from({ length: n }, (_, i) => (i < half ? f(1 + f(step * i)) : f(0 - f(step * (n - i - 1)))));
}

/** The timestep projection (diffusers Timesteps, flip_sin_to_cos): [cos(1000 t f), sin(1000 t f)]. */
export function timeFeatures(t, freqs) {
  const tt = f(t * 1000);
  const out = new Float32Array(2 * freqs.length);
  freqs.forEach((fr, i) => {
    const arg = f(tt * fr);
    out[i] = Math.cos(arg);
    out[freqs.length + i] = Math.sin(arg);
  });
  return out;
}

/** torch.randn(n) on a CPU generator seeded with ``seed``: mt19937, 24-bit uniforms, Box-Muller in blocks of 16. */
export function torchRandn(seed, n) {
  const mt = new Uint32Array(624);
  mt[0] = seed >>> 0;
  for (let i = 1; i < 624; i++) mt[i] = (Math.imul(1812433253, mt[i - 1] ^ (mt[i - 1] >>> 30)) + i) >>> 0;
  let at = 624;
  const next = () => {
    if (at >= 624) {
      for (let k = 0; k < 624; k++) {
        const y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7fffffff);
        mt[k] = mt[(k + 397) % 624] ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
      }
      at = 0;
    }
    let y = mt[at++];
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  };
  if (n % 16 !== 0) throw new Error(`noise of ${n} values: this generator covers multiples of 16`);
  const u = Float32Array.from({ length: n }, () => (next() & 0xffffff) * 2 ** -24);
  const out = new Float32Array(n);
  for (let b = 0; b < n; b += 16) {
    for (let j = 0; j < 8; j++) {
      const r = Math.sqrt(-2 * Math.log(f(1 - u[b + j])));
      const theta = 2 * Math.PI * u[b + j + 8];
      out[b + j] = r * Math.cos(theta);
      out[b + j + 8] = r * Math.sin(theta);
    }
  }
  return out;
}

/** RGBA (size x size) -> (tokens, 3 p^2) float32 in [-1, 1], row-major patches, (py, px, rgb) inside a patch. */
export function packImage(rgba, index) {
  const { image_size: s, patch_size: p } = index;
  const g = s / p;
  const out = new Float32Array(g * g * p * p * 3);
  let o = 0;
  for (let gy = 0; gy < g; gy++) for (let gx = 0; gx < g; gx++) {
    for (let py = 0; py < p; py++) for (let px = 0; px < p; px++) {
      const at = ((gy * p + py) * s + gx * p + px) * 4;
      for (let c = 0; c < 3; c++) out[o++] = f(f(rgba[at + c] / 127.5) - 1);
    }
  }
  return out;
}

const roundHalfEven = (x) => {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
};

/** (tokens, 3 p^2) in [-1, 1] -> RGBA bytes (size x size), as EditModel.unpack_tokens rounds. */
export function unpackTokens(x, index) {
  const { image_size: s, patch_size: p } = index;
  const g = s / p;
  const out = new Uint8ClampedArray(s * s * 4);
  let o = 0;
  for (let gy = 0; gy < g; gy++) for (let gx = 0; gx < g; gx++) {
    for (let py = 0; py < p; py++) for (let px = 0; px < p; px++) {
      const at = ((gy * p + py) * s + gx * p + px) * 4;
      for (let c = 0; c < 3; c++) out[at + c] = roundHalfEven(f(f(Math.min(1, Math.max(-1, x[o++])) + 1) * 127.5));
      out[at + 3] = 255;
    }
  }
  return out;
}
