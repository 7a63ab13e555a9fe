// Parse every manifest vector (tests/phone_web/manifest_vectors.py) with the page's parser and compare the outcome
// with Python's: accepted, or the same error class (Python's plain ValueError for bytes that are not JSON is
// JSONValueError here). Prints one JSON line per difference and a summary; exits 1 on any.
//   node test/run_manifests.mjs VECTOR_DIR
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseManifestBytes } from "../src/manifest.js";

const PY_NAMES = { ValueError: "JSONValueError" };
const index = JSON.parse(readFileSync(join(process.argv[2], "manifests.json"), "utf8"));
const counts = { valid: 0, validPass: 0, bad: 0, badPass: 0 };
for (const c of index.cases) {
  const bytes = c.bytes_hex !== undefined ? Uint8Array.from(Buffer.from(c.bytes_hex, "hex")) : new TextEncoder().encode(c.text);
  let got = "ok";
  try {
    parseManifestBytes(bytes, c.options ?? {});
  } catch (e) {
    got = e.name;
    if (!e.name || e.name === "Error" || e.name === "TypeError" || e.name === "RangeError") got = `${e.name}: ${e.message}`;
  }
  const want = PY_NAMES[c.expect] ?? c.expect;
  const valid = c.expect === "ok";
  counts[valid ? "valid" : "bad"] += 1;
  if (got === want) counts[valid ? "validPass" : "badPass"] += 1;
  else console.log(JSON.stringify({ name: c.name, got, python: c.expect }));
}
console.log(JSON.stringify({ summary: counts }));
process.exit(counts.valid === counts.validPass && counts.bad === counts.badPass ? 0 : 1);
