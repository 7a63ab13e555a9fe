// The page's fetch plan of a manifest (src/lanes/ladders.js pageLadders), printed with Python's field names for
// tests/phone_web/test_page_ladders.py to compare with sakura_core.policy.plan.plan_fetch: per shard its levels
// (name, nbytes, increment_bytes, decode_s, mse, progressive, ref_step, reuse, closed, off_track) and the
// representations they fetch (digest, the closed-loop twin's digest), and the floor.
//   node test/run_ladders.mjs MANIFEST.json FAMILY
import { readFileSync } from "node:fs";
import { pageLadders } from "../src/lanes/ladders.js";

const level = (lv) => lv === null ? null : ({ name: lv.name, nbytes: lv.nbytes, increment_bytes: lv.incrementBytes,
  decode_s: lv.decodeS, mse: lv.mse, progressive: lv.progressive, ref_step: lv.refStep, reuse: lv.reuse,
  closed: level(lv.closed), off_track: lv.offTrack });

const [path, family] = process.argv.slice(2);
const plan = pageLadders(JSON.parse(readFileSync(path, "utf8")), family);
console.log(JSON.stringify({
  ladders: plan.ladders.map((lad) => lad.map(level)),
  reps: plan.reps.map((reps) => reps.map((r) => ({ digest: r.digest, twin: r.closedTwin?.digest ?? null }))),
  floor: plan.floor,
}));
