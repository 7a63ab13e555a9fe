// Decode every template of tests/phone_web/template_vectors.py at every representation name and compare with
// Python's decode_template bit for bit (SHA-256 of the float16 KV laid out (steps, layers, 2, tokens, heads,
// head_dim)). Prints differences and a summary; exits 1 on any.   node test/run_templates.mjs VECTOR_DIR
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { decodeTemplate, sha256Hex } from "../src/index.js";

const dir = process.argv[2];
const index = JSON.parse(readFileSync(join(dir, "templates.json"), "utf8"));
const counts = { cases: 0, pass: 0 };
for (const t of index.templates) {
  const getBlob = (d) => new Uint8Array(readFileSync(join(dir, "blobs", d)));
  for (const [name, want] of Object.entries(t.expect)) {
    counts.cases += 1;
    let got;
    try {
      const steps = await decodeTemplate(t.manifest, getBlob, name);
      const parts = [];
      for (const shards of steps) {
        for (const { k, v } of shards) {
          const per = k.length / (shards[0].layers[1] - shards[0].layers[0] + 1); // one layer's values
          const layers = k.length / per;
          for (let l = 0; l < layers; l++) {
            parts.push(k.subarray(l * per, (l + 1) * per), v.subarray(l * per, (l + 1) * per));
          }
        }
      }
      const bytes = new Uint8Array(parts.reduce((a, p) => a + 2 * p.length, 0));
      let at = 0;
      for (const p of parts) {
        bytes.set(new Uint8Array(p.buffer, p.byteOffset, p.byteLength), at);
        at += p.byteLength;
      }
      got = await sha256Hex(bytes);
    } catch (e) {
      got = `${e.name}: ${e.message}`;
    }
    if (got === want) counts.pass += 1;
    else console.log(JSON.stringify({ template: t.name, name, got, want }));
  }
}
console.log(JSON.stringify({ summary: counts }));
process.exit(counts.cases === counts.pass ? 0 : 1);
