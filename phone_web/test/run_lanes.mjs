// The page's lanes (src/lanes) with a fake link, decoder, DiT step and template pass: each scenario runs a whole
// pipelined edit under node and checks what the lanes must do — the policy's levels fetched in execution order, the
// KV each step computed with (its own step's, its level, the device's where the template ran), the lanes overlapped,
// per-step KV freed once its step is done, the prefetch under the budget, every decision with a reason code, the
// late-shard race, a per-step template's cross-step levels decoded with their reference (the fakes: lane_fakes.mjs).
// Every wait runs on a virtual clock (VirtualTime: the earliest timer fires once nothing else can run), so a scenario
// gives the same timeline on any host. Prints one JSON line per scenario ({name, ok, failures, figures}); exits 1 on
// any failure.
//   node test/run_lanes.mjs
import { MeasuredProfile } from "../src/lanes/measured_profile.js";
import { lanesOverlap } from "../src/lanes/timeline.js";
import { delta, edit, L, manifest, mark, PER } from "./lane_fakes.mjs";

const results = [];
function check(name, figures, conds) {
  const failures = Object.entries(conds).filter(([, ok]) => !ok).map(([what]) => what);
  results.push({ name, ok: failures.length === 0, failures, figures });
}
const shardBytes = 2 * PER * 4;
const codesOf = (r) => new Set(r.decisions.map((d) => d.code));

{ // fetch-fp16, per-step KV, a budget of two shards: every shard at fp16 in order, each step its own KV, freed
  const budget = 2 * shardBytes;
  const { raw, f, report } = await edit("fetch-fp16", { budgetBytes: budget, link: { bytesPerS: 4e6, stepS: 0.2 } });
  const fp16 = raw.shards.map((s) => s.representations[0].digest);
  const ownKV = f.seen.every((ks, s) => ks.every((k, l) => k === mark(l, s, "fp16")));
  const heldOk = report.memory.held_samples.every(([, held]) => held <= L * shardBytes + budget);
  check("fetch-fp16 per-step under a budget", { peak_prefetch: report.memory.peak_prefetch_bytes, budget, busy: report.busy_s }, {
    "every fp16 shard once, in execution order": JSON.stringify(f.requested) === JSON.stringify(fp16),
    "each step computed with its own step's fp16 KV": ownKV && f.seen.length === 3,
    "fetch or decode overlaps compute": lanesOverlap(report.timeline, "fetch", "compute") || lanesOverlap(report.timeline, "decode", "compute"),
    "prefetch within the budget": report.memory.peak_prefetch_bytes <= budget && report.memory.peak_prefetch_bytes > 0,
    "held <= one step + budget at every change": heldOk,
    "per-step KV freed at the end": report.memory.held_bytes_at_end === 0,
    "every decision has a reason code": report.decisions.length >= 12 && report.decisions.every((d) => d.code === "fp16-exact"),
  });
}

{ // the same edit without a budget holds more ahead (the budget is what bounded it)
  const { report } = await edit("fetch-fp16", { link: { bytesPerS: 4e6, stepS: 0.2 } });
  check("fetch-fp16 per-step unbounded", { peak_prefetch: report.memory.peak_prefetch_bytes }, {
    "prefetch beyond two shards": report.memory.peak_prefetch_bytes > 2 * shardBytes,
  });
}

{ // sakura, single KV, no template pass: probe at the floor, every layer fetched, upgrades on the idle link
  const { f, report } = await edit("sakura", { perStep: false, steps: 3, link: { bytesPerS: 2e5 } });
  const codes = codesOf(report);
  const used = report.levels_used;
  const floorOk = used[0].every((n) => n === "sakura-l2" || n === "fp16");
  const stepOk = f.seen.every((ks, s) => ks.every((k, l) => k === mark(l, null, used[s][l])));
  check("sakura single, no pass", { used, codes: [...codes] }, {
    "probe then the floor": codes.has("probe") && codes.has("floor"),
    "the floor level at least (35 dB)": floorOk,
    "each step computed with the level it reports": stepOk,
    "split 0 (no pass)": report.split_layers.length === 1 && report.split_layers[0] === 0,
    "decisions coded": report.decisions.every((d) => typeof d.code === "string"),
  });
}

{ // sakura, per-step, a template pass and a slow link: the device keeps the template for some layers
  const { f, report } = await edit("sakura", { pass: true, link: { bytesPerS: 3e4 } });
  const used = report.levels_used.flat();
  const tmpl = report.timeline.filter((e) => e.lane === "compute" && e.level === "template").length;
  const ok = f.seen.every((ks, s) => ks.every((k, l) => (report.levels_used[s][l] === "template" ? k === -(l + 1) : true)));
  check("sakura per-step with a pass, slow link", { splits: report.split_layers, codes: [...codesOf(report)] }, {
    "template layers computed on the device": used.includes("template") && tmpl > 0,
    "device KV injected where the template ran": ok,
    "drops logged with their code": report.decisions.filter((d) => d.code === "drop").length === report.split_layers.filter((k) => k < L).length,
  });
}

{ // a late shard: the policy races a resumed template pass against it (recompute_late), and the pass wins
  const raw = manifest(null);
  const hang = raw.shards[2].representations.find((r) => r.name === "sakura-l1").digest;
  const profile = { layerFullS: 0.11, layerCachedS: 0.01, templatePassS: 0.4, fixedS: 0, steps: 2, ditCpuCores: 1 };
  const { report } = await edit("sakura", { perStep: false, steps: 2, pass: true, link: { bytesPerS: 2e6, hang }, profile });
  const codes = codesOf(report);
  check("late shard recomputed", { codes: [...codes], used: report.levels_used, stall: report.busy_s.stall }, {
    "a recompute decision": codes.has("recompute"),
    "a stall in the timeline": report.timeline.some((e) => e.lane === "stall"),
    "the template dropped": report.decisions.some((d) => d.code === "drop"),
    "the device made the late layer": report.levels_used[0][2] === "device" || report.levels_used[0][2] === "template",
  });
}

{ // sakura, per-step, a template pass that costs more than the link: the plan splits each step (the layers before
  // the split computed), the rest fetched as chosen; the same run twice gives the same timeline
  const profile = () => ({ layerFullS: 0.05, layerCachedS: 0.01, templatePassS: 0.16, fixedS: 0, steps: 3, ditCpuCores: 1 });
  const run = () => edit("sakura", { pass: true, link: { bytesPerS: 1e6 }, profile: profile() });
  const a = await run();
  const b = await run();
  const r = a.report;
  const codes = codesOf(r);
  const fetched = r.timeline.filter((e) => e.lane === "fetch").map((e) => e.layer);
  const chosen = fetched.every((g) => r.decisions.some((d) => d.layer === g && typeof d.level === "number" && d.level >= 0));
  check("sakura per-step split", { splits: r.split_layers, codes: [...codes], fetched }, {
    "a split inside some step": r.split_layers.some((k) => k > 0 && k < L),
    "the template dropped, coded": codes.has("drop") && codes.has("probe-waits"),
    "each step's layers after its split fetched": r.levels_used.every((ls, s) => ls.every((n, l) => (l < r.split_layers[s]) === (n === "template"))),
    "every fetch a level the policy chose": chosen,
    "the policy's asks timed": r.policy_calls >= r.decisions.length && r.policy_s > 0 && b.report.policy_calls === r.policy_calls,
    "deterministic": JSON.stringify(r.timeline) === JSON.stringify(b.report.timeline),
  });
}

{ // a shard's chain (sakura-l2 requires sakura-l1) requested together: one round trip a shard, as the policy plans
  const { raw, f, report } = await edit("sakura", { perStep: false, steps: 3, link: { bytesPerS: 2e5, rttS: 0.05 } });
  const chains = raw.shards.map((s) => s.representations.slice(1).map((r) => r.digest))
    .filter(([l1, l2]) => f.requestedAt.has(l1) && f.requestedAt.has(l2));
  check("a chain in one round trip", { chains: chains.length, fetches: report.timeline.filter((e) => e.lane === "fetch").length }, {
    "some shard fetched its chain": chains.length > 0,
    "its blobs requested at one moment": chains.every(([l1, l2]) => f.requestedAt.get(l1) === f.requestedAt.get(l2)),
  });
}

{ // the compute costs measured (a 0.08 s DiT step, 0.01 s template-pass layers): the edit's policy plans with them,
  // the template pass included, and a page session's MeasuredProfile hands them to the next edit from its start
  const measured = new MeasuredProfile();
  const { e } = await edit("on-device", { pass: true, measured, link: { stepS: 0.08 } });
  const close = (a, b) => Math.abs(a - b) < 1e-9;
  const p = e.st.profile;
  const next = measured.profileFor(L, 3, true);
  check("measured profile", { profile: p, next }, {
    "a cached layer: the step over the layers": close(p.layerCachedS, 0.08 / L),
    "the template pass: its layers measured": close(p.templatePassS, 0.01 * L) && close(p.layerFullS, 0.08 / L + 0.01),
    "the next edit starts from them": close(next.templatePassS, 0.01 * L) && close(next.layerCachedS, 0.08 / L),
    "a fresh session guesses": new MeasuredProfile().profileFor(L, 3, true).layerCachedS === 0.05,
  });
}

{ // the decode rate measured (the fake pool decodes a shard in 0.01 s): the session's MeasuredProfile keeps it per
  // level, and the next edit's ladders give the levels decoded the measured seconds, the others the default rate
  const measured = new MeasuredProfile();
  const first = await edit("fetch-fp16", { measured, link: { bytesPerS: 4e6 } });
  const second = await edit("sakura", { measured, link: { bytesPerS: 4e6 } });
  const fp16Bytes = shardBytes / 2;
  const rates = measured.decodeRates();
  const level = (e, name) => e.plan.ladders[0].find((lv) => lv.name === name);
  const close = (a, b) => Math.abs(a - b) < 1e-9;
  check("measured decode rate", { rates }, {
    "fp16 decoded at its measured rate": close(rates.fp16, fp16Bytes / 0.01),
    "a fresh edit's ladders: the default rate": close(level(first.e, "fp16").decodeS, fp16Bytes / 6e8),
    "the next edit plans fp16 with it": close(level(second.e, "fp16").decodeS, 0.01),
    "levels not decoded before it keep the default": ["sakura-l1", "sakura-l2"].every((n) => close(level(second.e, n).decodeS, fp16Bytes / 6e8)),
    "the second edit's decodes measured too": close(rates["sakura-l2"] ?? 0, fp16Bytes / 0.01),
    "an untimed decode is no sample": (() => { const m = new MeasuredProfile(); m.observeDecode("x", 10, 0); return !("x" in m.decodeRates()); })(),
  });
}

{ // a small template image before the lanes (9 KB in 0.1 s, its first byte at 0.05 s: under the 16 KiB the lanes'
  // samples pool to) seeds the estimator all the same, so step 0 is planned on it: no bandwidth probe
  const probe = await edit("sakura", { pass: true, link: { bytesPerS: 2e5 } });
  const seeded = await edit("sakura", { pass: true, link: { bytesPerS: 2e5 }, preLanes: [[9000, 0.1, 0.05]] });
  check("a small image seeds step 0", { probe: [...codesOf(probe.report)], seeded: [...codesOf(seeded.report)] }, {
    "unseeded: step 0 waits for the probe": codesOf(probe.report).has("probe-waits"),
    "seeded: no probe": !codesOf(seeded.report).has("probe-waits") && !codesOf(seeded.report).has("probe"),
    "the seed is the estimator's sample": seeded.e.st.estimator.samples >= 1,
  });
}

{ // on-device: nothing fetched, every layer of every step from the template pass
  const { f, report } = await edit("on-device", { pass: true });
  check("on-device", { codes: [...codesOf(report)] }, {
    "nothing fetched": f.requested.length === 0 && report.bytes_fetched === 0,
    "every layer template": report.levels_used.flat().every((n) => n === "template"),
    "never-fetches reason": codesOf(report).has("never-fetches"),
  });
}

{ // on-device without a template pass: a clear error
  let msg = "";
  try { await edit("on-device"); } catch (e) { msg = e.message; }
  check("on-device without a pass", { msg }, { "says what to choose": msg.includes("choose fetch-fp16 or sakura") });
}

{ // requests ahead on a 80 ms round trip (the page bench's 40 ms each way): after the bandwidth probe, the next
  // shard's request leaves while the one before still arrives, so the wire goes from one shard to the next without
  // idling; one request at a time, it idles a round trip between shards
  const rtt = 0.08;
  const run = (requestAhead) => edit("fetch-fp16", { requestAhead, rttS: rtt, link: { fifo: true, bytesPerS: 4e5, rttS: rtt, stepS: 0.5 } });
  const on = await run(true);
  const off = await run(false);
  const gaps = (f) => f.busy.slice(1).map(([start], i) => start - f.busy[i][1]);
  const gOn = gaps(on.f);
  const gOff = gaps(off.f);
  const order = (r) => r.timeline.filter((e) => e.lane === "fetch").map((e) => e.layer).join(",");
  check("requests ahead: the link does not idle between shards", { gaps_on: gOn, gaps_off: gOff, latency: [on.report.latency_s, off.report.latency_s] }, {
    "12 shards each way": on.f.busy.length === 12 && off.f.busy.length === 12,
    // (the estimator's samples include a round trip, as Python's, so the window is a little short of the link's
    // bandwidth-delay product: the next request leaves a few ms late, never a round trip)
    "on: a round trip after the probe only": gOn[0] >= rtt - 1e-9 && gOn.slice(1).every((g) => g < rtt / 10),
    "off: a round trip between every two shards": gOff.every((g) => g >= rtt - 1e-9),
    "the report says which": on.report.request_ahead === true && off.report.request_ahead === false,
    "on: the transfers in execution order": order(on.report) === [...Array(12).keys()].join(","),
    "on: the fetch lane ends sooner": on.report.timeline.filter((e) => e.lane === "fetch").at(-1).end
      < off.report.timeline.filter((e) => e.lane === "fetch").at(-1).end - 9 * rtt,
  });
}

{ // a fetcher that reads on without awaiting its turns: the lane notices and goes back to one request at a time
  const { report } = await edit("fetch-fp16", { link: { awaitsTurns: false, bytesPerS: 4e5, rttS: 0.05 }, rttS: 0.05 });
  const fetches = report.timeline.filter((e) => e.lane === "fetch");
  check("requests ahead with a fetcher that does not await its turns", { request_ahead: report.request_ahead }, {
    "ahead turned off": report.request_ahead === false,
    "every shard fetched and computed": fetches.length === 12 && report.levels_used.flat().every((n) => n === "fp16"),
  });
}

/** Cross-step checks of a per-step edit: every residual or twin decoded against its reference as the device held it
 *  (the value step s-1 computed that layer with: fetched or the template pass's), the KV each step computed with the
 *  reference's plus the residual, a twin only against the representation it names. */
function crossChecks(f, report) {
  const used = report.levels_used;
  const cross = f.decodes.filter((x) => x.ref !== null);
  // what the device held of (step, layer): the decodes of it and the template pass's KV, by value
  const heldAs = (x) => f.decodes.filter((y) => y.step === x.step - 1 && y.layer === x.layer && y.value === x.ref);
  const ownRef = cross.every((x) => x.refStep === x.step - 1 && (heldAs(x).length > 0 || x.ref === -(x.layer + 1)));
  const sum = cross.every((x) => x.value === x.ref + delta(x.step, x.name));
  const twinTrack = cross.filter((x) => x.name.endsWith("+cl"))
    .every((x) => heldAs(x).some((y) => y.name === (x.step === 1 ? x.name.replace("+cl", "") : x.name)));
  const stepKV = f.seen.every((ks, s) => ks.every((k, l) => {
    const n = used[s][l];
    if (n === "template") return k === -(l + 1);
    const last = f.decodes.filter((x) => x.step === s && x.layer === l).at(-1);
    return last !== undefined && k === last.value && last.name === n;
  }));
  return { cross, conds: {
    "each residual / twin decoded against its reference as the device held it": ownRef,
    "its KV the reference's plus the residual": sum,
    "a twin only on its track": twinTrack,
    "each step computed with the KV decoded at the level it reports": stepKV,
    "nothing held after the edit": report.memory.held_bytes_at_end === 0,
  } };
}

{ // sakura, per-step cross-step template, no pass: steps >= 1 fetch residuals / closed-loop twins (a few KB, not the
  // 40 KB fp16), each decoded with its reference; the reuse rung is no rung (as Python's ladders); nothing left held
  const { raw, f, report, e } = await edit("sakura", { cross: true, link: { bytesPerS: 2e5 } });
  const { cross, conds } = crossChecks(f, report);
  const laterFp16 = raw.shards.filter((s) => s.step > 0).map((s) => s.representations.find((r) => r.name === "fp16").digest);
  check("sakura per-step cross-step levels", { used: report.levels_used, bytes: report.bytes_fetched, cross: cross.length }, {
    ...conds,
    "cross-step levels fetched": cross.length >= L,
    "twins fetched on their track": cross.some((x) => x.name.endsWith("+cl")),
    "the floor on the twins' track, the open-loop floor off it": report.floor[L] === "sakura-l1" && e.plan.ladders[L][0].offTrack === 1,
    "no reuse rung offered": e.plan.ladders.every((lad) => lad.every((lv) => lv.name !== "reuse" && !lv.reuse)),
    "no later-step fp16 fetched": !f.requested.some((d) => laterFp16.includes(d)),
  });
}

{ // the same with a template pass on a slow link: layers the device computed at a step are the references of the next
  // step's residuals (kept past the step, freed once decoded), the rest as above
  const profile = { layerFullS: 0.05, layerCachedS: 0.01, templatePassS: 0.16, fixedS: 0, steps: 3, ditCpuCores: 1 };
  const { f, report } = await edit("sakura", { cross: true, pass: true, profile, link: { bytesPerS: 1e5 } });
  const { cross, conds } = crossChecks(f, report);
  const onDevice = cross.filter((x) => x.ref < 0); // against the template pass's KV (-(layer + 1))
  check("sakura per-step cross-step levels with a pass", { used: report.levels_used, splits: report.split_layers, on_device: onDevice.length }, {
    ...conds,
    "the template ran for some layers": report.levels_used.flat().includes("template"),
    "a residual decoded against the device's KV": onDevice.length > 0 || !report.levels_used.slice(0, -1).some((ls, s) =>
      ls.some((n, l) => n === "template" && report.levels_used[s + 1][l] !== "template")),
  });
}

for (const r of results) console.log(JSON.stringify(r));
const bad = results.filter((r) => !r.ok).length;
console.log(JSON.stringify({ summary: { scenarios: results.length, failed: bad } }));
process.exit(bad ? 1 : 0);
