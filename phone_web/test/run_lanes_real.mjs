// The page's lanes on a real per-step template (a store directory written by publish_template, per-step sakura, full
// profile) with its real decoders (in-thread pool), a fake link and DiT step, the sakura policy: every step's KV
// equals the fixed-level decoder's (src/template.js decodeTemplate, bit-exact with Python's decode_template) at the
// levels the lanes report, cross-step references followed — and steps >= 1 fetch cross-step levels, not fp16.
// Prints one JSON line {ok, failures, figures}; exits 1 on a failure.   node test/run_lanes_real.mjs STORE TEMPLATE_ID
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { slotFromManifest } from "../src/binding.js";
import { f16Table } from "../src/f16.js";
import { DecodePool } from "../src/lanes/decode_pool.js";
import { PipelinedEdit } from "../src/lanes/pipeline.js";
import { decodeTemplate } from "../src/template.js";

const [store, id] = process.argv.slice(2);
const raw = JSON.parse(readFileSync(join(store, "templates", id, "manifest.json"), "utf8"));
const blob = (d) => new Uint8Array(readFileSync(join(store, "shards", d.slice(0, 2), d)));
const L = raw.num_layers;
const steps = raw.schedule.steps;
const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));
const seen = [];
const fetchBlob = async (digest, bytes, onChunk) => { // 2 MB/s, in four chunks
  for (let i = 0; i < 4; i++) { await sleep(bytes / 2e6 / 4); await onChunk(bytes / 4); }
  return blob(digest);
};
const [rows, cols] = raw.token_grid;
const edit = new PipelinedEdit({ raw, policy: "sakura", fetchBlob, pool: new DecodePool({ size: 1 }),
  slotOf: (g, rep) => slotFromManifest(raw, g % L, rep, Math.floor(g / L)),
  computeStep: async (step, kv) => { seen.push(kv.map((x) => ({ k: x.k.slice(), v: x.v.slice() }))); await sleep(0.05); },
  times: raw.schedule.timesteps, steps, tokens: rows * cols, heads: raw.heads, headDim: raw.head_dim, budgetBytes: null });
const report = await edit.run();
const used = report.levels_used;
const want = await decodeTemplate(raw, blob, ({ layers, step }) => used[step][layers[0]]);
const tab = f16Table();
const equal = (a, b) => a.length === b.length && a.every((x, i) => x === tab[b[i]]);
const same = seen.every((kv, s) => kv.every((x, l) => equal(x.k, want[s][l].k) && equal(x.v, want[s][l].v)));
const later = raw.shards.filter((s) => s.step > 0);
const crossNames = new Set(later.flatMap((s) => s.representations.filter((r) => r.ref).map((r) => r.name)));
const failures = Object.entries({
  "every step's KV equals the fixed-level decoder's at the levels reported": same && seen.length === steps,
  "steps >= 1 fetched cross-step levels": used.slice(1).flat().every((n) => crossNames.has(n)),
  "nothing held after the edit": report.memory.held_bytes_at_end === 0,
  "no fallback": report.fallbacks.length === 0,
}).filter(([, ok]) => !ok).map(([what]) => what);
console.log(JSON.stringify({ ok: failures.length === 0, failures, figures: { used, bytes: report.bytes_fetched, fallbacks: report.fallbacks } }));
process.exit(failures.length ? 1 : 0);
