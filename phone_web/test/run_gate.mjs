// Replay the fetch-lane gate vectors of tests/phone_web/gate_vectors.py through the page's gates
// (src/lanes/lane_rules.js): the request-ahead window and gate at each recorded estimator state, the prefetch room at
// each recorded call; prints one JSON line per difference (the first 50) and a summary (cases, pass, by reason); exits
// 1 on any.
//   node test/run_gate.mjs VECTOR_DIR
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { aheadWindowBytes, hasPrefetchRoom, prefetchRoom, requestGate } from "../src/lanes/lane_rules.js";
import { EstimatorConfig, ThroughputEstimator } from "../src/policy/index.js";

const { cases } = JSON.parse(readFileSync(join(process.argv[2], "gate_cases.json"), "utf8"));

function estimatorOf(s) {
  const c = s.config;
  const config = new EstimatorConfig({ window: c.window, minSampleBytes: c.min_sample_bytes, priorBytesPerS: c.prior_bytes_per_s });
  return ThroughputEstimator.fromState(config, s);
}

function answer(c) {
  if (c.call === "gate") {
    const est = estimatorOf(c.estimator);
    const [go, reason] = requestGate(est, c.rtt_s, c.left);
    return { window: aheadWindowBytes(est, c.rtt_s), go, reason };
  }
  const reason = prefetchRoom(...c.args);
  return { reason, go: hasPrefetchRoom(...c.args) };
}

const byReason = {};
let pass = 0;
for (const [i, c] of cases.entries()) {
  const got = answer(c);
  const want = c.call === "gate" ? { window: c.window, go: c.go, reason: c.reason } : { reason: c.reason, go: c.go };
  const same = Object.keys(want).every((k) => Object.is(got[k], want[k]));
  byReason[c.reason] = (byReason[c.reason] ?? 0) + 1;
  if (same) pass += 1;
  else if (i - pass < 50) console.log(JSON.stringify({ case: i, call: c.call, want, got })); // the first 50 differences
}
console.log(JSON.stringify({ summary: { cases: cases.length, pass, reasons: byReason } }));
process.exitCode = pass === cases.length ? 0 : 1; // (process.exit could cut the piped output short)
