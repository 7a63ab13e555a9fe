// Replay the recorded policy decisions of tests/phone_web/policy_vectors.py through the page's policy
// (src/policy): each sequence (one simulated edit) with one policy instance, every call with the state Python's
// policy saw; prints one JSON line per difference and a summary; exits 1 on any.
//   node test/run_policy.mjs VECTOR_DIR [--perturb JSON]
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Context, EstimatorConfig, levelFromJson, makePolicy, Sakura, ThroughputEstimator } from "../src/policy/index.js";
import { fixed } from "../src/policy/pyfloat.js";

const dir = process.argv[2];
// --perturb '{"late_patience": 0.3}': run the page's policy with a rule constant changed (the suite must then fail)
const at = process.argv.indexOf("--perturb");
const PERTURB = at > 0 ? JSON.parse(process.argv[at + 1]) : {};
const { sequences, estimator = [], formats = [] } = JSON.parse(readFileSync(join(dir, "policy_cases.json"), "utf8"));

function staticOf(st) {
  const table = st.ladders.map((lad) => lad.map(levelFromJson));
  const p = st.profile;
  const e = st.estimator_config;
  return {
    profile: { layerFullS: p.layer_full_s, layerCachedS: p.layer_cached_s, templatePassS: p.template_pass_s, fixedS: p.fixed_s, steps: p.steps, ditCpuCores: p.dit_cpu_cores },
    ladders: st.ladder_of.map((i) => table[i]),
    floor: st.floor,
    layersPerStep: st.layers_per_step,
    rttS: st.rtt_s,
    requestAhead: st.request_ahead,
    startS: st.start_s,
    latencyTargetS: st.latency_target_s,
    hasTrace: st.has_trace,
    reroots: Boolean(st.reroots),
    estimatorConfig: new EstimatorConfig({ window: e.window, minSampleBytes: e.min_sample_bytes, priorBytesPerS: e.prior_bytes_per_s }),
  };
}

function stateOf(fixed, s) {
  const known = Float64Array.from(s.known_ready, (x) => (x === null ? NaN : x));
  const fetched = new Map(s.fetched_levels);
  const prog = s.link_progress;
  return {
    ...fixed,
    estimator: ThroughputEstimator.fromState(fixed.estimatorConfig, s.estimator),
    now: s.now,
    linkFree: s.link_free,
    decoderFree: s.decoder_free,
    computeLayer: s.compute_layer,
    computeT: s.compute_t,
    templateAlive: s.template_alive,
    droppedAt: s.dropped_at,
    nextLayer: s.next_layer,
    stalledS: s.stalled_s,
    got: new Map(s.got),
    inFlight: new Map(s.in_flight),
    knownReadyArray: () => known,
    fetchedLevels: () => fetched,
    linkProgress: () => prog,
  };
}

function answer(policy, ctx, c) {
  switch (c.call) {
    case "choose": {
      const d = policy.choose(ctx, c.shard);
      return { level: d.level, reason: d.reason, defer: d.defer, link_idle_until_s: d.linkIdleUntilS };
    }
    case "keep_template": {
      if (policy instanceof Sakura) {
        const rule = policy.keepTemplateRule(ctx, c.shard);
        return { keep: rule !== "drop", code: rule };
      }
      const keep = policy.keepTemplate(ctx, c.shard);
      return { keep, code: keep ? "always-keep" : "never-keep" };
    }
    case "recompute_late": {
      const late = policy.recomputeLate(ctx, c.shard);
      return { recompute: late, code: late ? "recompute" : "wait" };
    }
    case "upgrade": {
      const up = policy.upgrade(ctx);
      return { upgrade: up, code: up === null ? "no-upgrade" : "upgrade" };
    }
    case "reroot_chain": {
      const chain = policy.rerootChain(ctx, c.shard);
      return { chain, code: chain.length ? "reroot" : "no-reroot" };
    }
    case "worth_asking":
      return { shards: policy.worthAsking(ctx, c.shards), code: "worth-asking" };
    default:
      throw new Error(`unknown call ${c.call}`);
  }
}

const counts = { cases: 0, pass: 0, codes: {} };
for (const seq of sequences) {
  const fixed = staticOf(seq.static);
  const policy = makePolicy(seq.policy);
  // a situation's rule constants (Python's class attributes, snake_case) and the suite's own perturbations
  for (const [k, v] of Object.entries({ ...(seq.constants || {}), ...PERTURB })) {
    policy[k.replace(/_(.)/g, (_, c) => c.toUpperCase())] = v;
  }
  seq.cases.forEach((c, i) => {
    counts.cases += 1;
    const want = { ...c.want };
    delete want.code;
    let got;
    try {
      got = answer(policy, new Context(stateOf(fixed, c.state)), c);
    } catch (e) {
      got = { error: `${e.name}: ${e.message}` };
    }
    const code = c.call === "choose" ? c.want.code : got.code;
    const gotCore = { ...got };
    delete gotCore.code;
    const same = JSON.stringify(gotCore) === JSON.stringify(want) && code === c.want.code;
    if (same) {
      counts.pass += 1;
      counts.codes[code] = (counts.codes[code] || 0) + 1;
    } else {
      console.log(JSON.stringify({ world: seq.world, trace: seq.trace, start_s: seq.start_s, policy: seq.policy, index: i, call: c.call, shard: c.shard, want: c.want, got }));
    }
  });
}
// the estimator fed the same observations, and numbers written as Python's :.2f
for (const stream of estimator) {
  const c = stream.config;
  const est = new ThroughputEstimator(new EstimatorConfig({ window: c.window, minSampleBytes: c.min_sample_bytes,
    priorBytesPerS: c.prior_bytes_per_s, seedRttShare: c.seed_rtt_share }));
  (stream.seed ?? []).forEach(([nbytes, seconds, rttS], i) => { // transfers before the lanes, first
    est.seed(nbytes, seconds, rttS);
    const got = [est.harmonic(), est.robust(), est.worst(), est.samples];
    counts.cases += 1;
    if (JSON.stringify(got) === JSON.stringify(stream.after_seed[i])) counts.pass += 1;
    else console.log(JSON.stringify({ estimatorSeed: i, want: stream.after_seed[i], got }));
  });
  stream.observe.forEach(([nbytes, seconds], i) => {
    est.observe(nbytes, seconds);
    const got = [est.harmonic(), est.robust(), est.worst(), est.samples];
    counts.cases += 1;
    if (JSON.stringify(got) === JSON.stringify(stream.after[i])) counts.pass += 1;
    else console.log(JSON.stringify({ estimator: i, want: stream.after[i], got }));
  });
}
for (const [x, want] of formats) {
  counts.cases += 1;
  const got = fixed(x === null ? NaN : x, 2);
  if (got === want) counts.pass += 1;
  else console.log(JSON.stringify({ format: x, want, got }));
}
console.log(JSON.stringify({ summary: counts }));
process.exit(counts.pass === counts.cases ? 0 : 1);
