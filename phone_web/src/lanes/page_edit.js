// An edit in the page through the lanes (pipeline.js), driven by the page's policy: the manifest (the page's
// prefetch, fetched while its model loaded, else fetched now; the link's round trip the policy plans with is its
// GET's time, or the first shard's first byte on the edit's link when the manifest came earlier), the shards
// streamed with fetchShard (its chunks are the policy's view of the transfer), decoded in the worker pool, the DiT
// steps on onnxruntime-web on this thread (dit_step.js), the template pass of template_pass.js where the model's files
// have per-layer template graphs (loaded when the module exists and returns one; else every layer is fetched).
// Returns {rgba, report}; the report holds the lanes' timeline, decisions (with reason codes), busy seconds and
// memory, besides what a fixed-level edit reports. A page passes its session's decode pool (pool: started and warmed
// at model load), measured profile (measured: measured_profile.js) and manifest prefetch (manifestFetch), so an edit
// neither waits for cold workers, nor plans its first decisions with a guessed compute profile, nor waits a round
// trip for the manifest.
import { slotFromManifest } from "../binding.js";
import { DitSteps } from "../dit_step.js";
import { checkSchedule, executedOn, fetchManifest, fetchManifestBytes, templateTokens } from "../edit.js";
import { fetchShard } from "../fetch_shard.js";
import { DecodePool } from "./decode_pool.js";
import { defaultBudgetBytes, PipelinedEdit } from "./pipeline.js";

const now = () => performance.now() / 1000;

/** The template pass of template_pass.js, or {pass: null, why}: the module is not in this page, or the model's
 *  files have no per-layer template graphs (older exports). */
export async function loadTemplatePassIfAny({ base, index, ort, providers }) {
  let mod;
  try {
    mod = await import("../template_pass.js");
  } catch (e) {
    return { pass: null, why: `no template pass module in this page (${e.message.slice(0, 120)}): every layer is fetched` };
  }
  const pass = await mod.loadTemplatePass({ base, index, ort, providers });
  return pass === null ? { pass: null, why: "the model's files have no per-layer template graphs: every layer is fetched" }
    : { pass, why: `per-layer template graphs (${pass.layers} layers)` };
}

export async function runLanesEdit({ origin, templateId, rgba, prompt, steps, seed, model, run, token = null, policy,
  memoryBudgetBytes = null, onEvent = () => {}, onProgress = () => {}, templatePass = undefined, modelBase = "model/",
  profile = null, measured = null, pool = null, manifestFetch = null, requestAhead = true }) {
  const { index } = model;
  const t0 = now();
  // the page's prefetch (manifestFetch: fetchManifestBytes's promise, started while the model loaded) or a GET now
  const got = await (manifestFetch ?? fetchManifestBytes(origin, templateId, token));
  // parsed once per page session (the prefetch's object keeps it; 0.2 MB of JSON checked is not free on a phone)
  if (got.parsed?.modelId !== index.model_id) {
    got.parsed = { modelId: index.model_id, ...await fetchManifest(origin, templateId, index.model_id, token, got) };
  }
  const { manifest, raw, bytes } = got.parsed;
  // the link's round trip as the page measures it: its manifest GET; when the manifest came earlier (maybe over
  // another link), the lanes' first transfer's first byte replaces it (rttFromFirstByte; the bandwidth probe's)
  const rttS = Math.min(got.seconds, 1.0);
  const refs = manifest.references.length;
  if (manifest.kvMode === "per-step") checkSchedule(templateId, raw.schedule, steps);
  const want = [index.grid[0] * refs, index.grid[1]];
  if (raw.token_grid.join("x") !== want.join("x")) throw new Error(`template grid ${raw.token_grid} is not ${refs} reference(s) of the model's ${index.grid}`);
  let tp = templatePass === undefined ? await loadTemplatePassIfAny({ base: modelBase, index, ort: run.ort, providers: [run.ep] })
    : { pass: templatePass, why: templatePass === null ? "none given" : "given" };
  if (tp.pass !== null && refs > 1) tp = { pass: null, why: `${refs} references: the template pass takes one image, every layer is fetched` };
  let imageBytes = 0;
  let imageFetch = null; // { bytes, seconds, firstByteS } of the template image's fetch
  let tokensOnce = null;
  const tokensOf = () => {
    tokensOnce ??= templateTokens(origin, raw.template_image, index, token).then((x) => { imageBytes = x.bytes; imageFetch = x; return x.tokens; });
    return tokensOnce;
  };
  const L = raw.num_layers;
  const perStep = manifest.kvMode === "per-step";
  const ownPool = pool === null; // the page's session pool (started and warmed at model load), else this edit's own
  const lanesPool = pool ?? DecodePool.forPage();
  const dit = new DitSteps({ model, run, rgba, prompt, steps, seed });
  const budget = memoryBudgetBytes ?? defaultBudgetBytes();
  let fetched = 0;
  const shown = (kind, entry) => {
    if (kind === "event" && entry.lane === "fetch") onProgress("fetched", ++fetched, perStep ? L * steps : L);
    onEvent(kind, entry);
  };
  // the template image before any shard: the pass needs it for step 0's first layer, and requested alongside the
  // lanes' first shards it landed 0.15-0.2 s into the edit on the page bench (0.02-0.05 s alone); fetch-fp16 never
  // runs the pass and skips it
  const tImage = now();
  const policyName = typeof policy === "string" ? policy : policy.name;
  if (tp.pass !== null && policyName !== "fetch-fp16") await tokensOf();
  const tLanes = now();
  // the image fetched before the lanes seeds the estimator (its measured round trip, request to first byte, taken
  // off: estimator.js seed), so step 0 is planned on this link, not on the prior
  const preLanes = imageFetch === null ? [] : [[imageFetch.bytes, imageFetch.seconds, imageFetch.firstByteS]];
  const edit = new PipelinedEdit({ raw, policy, pool: lanesPool, times: dit.times, steps, rttS, budgetBytes: budget, onEvent: shown,
    fetchBlob: (digest, nbytes, onChunk) => fetchShard(origin, digest, nbytes, { token, onChunk }),
    slotOf: (g, rep) => slotFromManifest(raw, g % L, rep, perStep ? Math.floor(g / L) : null),
    computeStep: async (step, kv) => { await dit.step(step, kv); onProgress("computed", step + 1, steps); },
    templatePass: tp.pass, templateTokens: tokensOf, profile, measured,
    tokens: raw.token_grid[0] * raw.token_grid[1], heads: index.heads, headDim: index.head_dim,
    rttFromFirstByte: manifestFetch !== null, requestAhead, preLanes });
  let lanes;
  try {
    lanes = await edit.run();
  } finally {
    if (ownPool) lanesPool.close();
  }
  const done = now();
  const report = {
    template_id: templateId,
    model_id: index.model_id,
    steps,
    seed,
    policy: lanes.policy,
    kv_mode: manifest.kvMode,
    split_layer: lanes.split_layers[0] ?? 0,
    split_layers: lanes.split_layers,
    level: "per-shard",
    level_psnr_db: null,
    shard_levels: lanes.levels_used,
    floor: lanes.floor[0],
    references: refs,
    bytes_fetched: lanes.bytes_fetched + imageBytes,
    manifest_bytes: bytes.byteLength,
    // manifest_get_s: its GET's seconds, prefetched (off this edit's path: timings_s.manifest is the wait for it) or not
    manifest_prefetched: manifestFetch !== null,
    manifest_get_s: got.seconds,
    rtt_s: lanes.rtt_s,
    request_ahead: lanes.request_ahead, // the fetch lane's requests went ahead of the wire (else one at a time)
    template_pass: tp.why,
    timings_s: { manifest: tImage - t0, template_image: tLanes - tImage, lanes: done - tLanes, total: done - t0, per_step: lanes.per_step_s },
    where: { fetch: "main thread (streaming fetch)", decode: `${lanesPool.inThread ? "main thread" : `${lanesPool.size} module worker(s)`}${ownPool ? "" : " (the page's, warm)"}`,
      compute: run.ort.env?.wasm?.proxy ? "onnxruntime-web's proxy worker" : "main thread (onnxruntime-web)" },
    busy_s: lanes.busy_s,
    stalled_s: lanes.stalled_s,
    memory: lanes.memory,
    decisions: lanes.decisions,
    policy_s: lanes.policy_s, // the policy's asks, seconds on the page's thread
    policy_calls: lanes.policy_calls,
    fallbacks: lanes.fallbacks,
    timeline: lanes.timeline,
    executed_on: executedOn(run),
  };
  return { rgba: dit.rgba(), report };
}
