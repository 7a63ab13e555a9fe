// Decode every conformance vector (tests/phone_web/vectors.py writes them) with the page's modules and compare with
// Python's outcome: golden vectors bit for bit, bad ones by error class. Prints one JSON line per failure and a
// summary line; exits 1 when anything differs.   node test/run_vectors.mjs VECTOR_DIR
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { checkBlob, decodeChain, decodeForSlot, reuseReference } from "../src/index.js";

const dir = process.argv[2];
const index = JSON.parse(readFileSync(join(dir, "index.json"), "utf8"));
const read = (name) => new Uint8Array(readFileSync(join(dir, name)));
const f16 = (name) => {
  const b = read(name);
  return new Uint16Array(b.buffer, b.byteOffset, b.length / 2);
};

function firstDiff(a, b) {
  if (a.length !== b.length) return `length ${a.length} != ${b.length}`;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return `index ${i}: 0x${a[i].toString(16)} != 0x${b[i].toString(16)}`;
  return null;
}

async function run(c) {
  const blobs = c.blobs.map(read);
  const ref = c.reference ? { step: c.reference.step, digest: c.reference.digest, k: f16(c.reference.k), v: f16(c.reference.v) } : null;
  if (c.check) await checkBlob(blobs[0], c.check.digest, c.check.bytes);
  if (c.reuse) return reuseReference(c.reuse, ref);
  if (c.slot) {
    const s = c.slot;
    const slot = { templateId: s.template_id, modelId: s.model_id, layers: s.layers, codec: s.codec, levelName: s.level_name,
      tokenGrid: s.token_grid, heads: s.heads, headDim: s.head_dim, step: s.step, reference: s.reference };
    return decodeForSlot(blobs, slot, ref);
  }
  return decodeChain(blobs, ref);
}

const counts = { golden: 0, goldenPass: 0, bad: 0, badPass: 0 };
const byFamily = {};
for (const c of index.cases) {
  const golden = !("error" in c.expect);
  counts[golden ? "golden" : "bad"] += 1;
  let problem = null;
  try {
    const { k, v } = await run(c);
    if (!golden) problem = `decoded; Python raises ${c.expect.error}`;
    else problem = firstDiff(k, f16(c.expect.k)) ?? firstDiff(v, f16(c.expect.v));
    if (problem && golden) problem = `not bit-exact: ${problem}`;
  } catch (e) {
    if (golden) problem = `raised ${e.name}: ${e.message}`;
    else if (e.name !== c.expect.error) problem = `raised ${e.name} (${e.message}); Python raises ${c.expect.error}`;
  }
  const f = (byFamily[c.family] ??= { cases: 0, pass: 0 });
  f.cases += 1;
  if (problem === null) {
    counts[golden ? "goldenPass" : "badPass"] += 1;
    f.pass += 1;
  } else {
    console.log(JSON.stringify({ name: c.name, problem }));
  }
}
console.log(JSON.stringify({ summary: counts, families: byFamily }));
process.exit(counts.golden === counts.goldenPass && counts.bad === counts.badPass ? 0 : 1);
