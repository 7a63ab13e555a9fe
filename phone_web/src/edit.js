// One private edit in the page: the template's manifest and shards (fp16, or the level asked for: one name, or a name
// per shard) come from the server, with the read token when there is one; the user's photo and prompt never leave the
// page. Layers >= split take the fetched template K/V (one reference or several), single or per-step KV mode; with
// a split (single mode) layers < split take the K/V the page computes from the template image with the template
// graph: the sakura_core.runtime.denoise.run_edit loop with that split_layer, each step one run of the exported graph
// (android_bridge/web_export.py) on onnxruntime-web. With a templatePass (template_pass.js) any split 0..layers is
// computed layer by layer, single or per-step (each step's layers < split at its own time): split = layers is the
// on-device edit, nothing but the template image fetched.
import { parseManifestBytes } from "./manifest.js";
import { fetchShard } from "./fetch_shard.js";
import { decodeTemplate, templatePlan } from "./template.js";
import { f16Table } from "./f16.js";
import { flowTimes, packImage } from "./web_model.js";
import { DitSteps } from "./dit_step.js";

const now = () => performance.now() / 1000;

/** The manifest bytes of ``templateId``, fetched with the read token if any, and the seconds its GET took; not parsed
 *  yet (that needs the model's id): a page fetches them while its model loads (page/index.html). */
export async function fetchManifestBytes(origin, templateId, token = null) {
  const t0 = now();
  const answer = await fetch(`${origin}/v1/templates/${encodeURIComponent(templateId)}/manifest`, { headers: authHeaders(token) });
  if (!answer.ok) throw new Error(answerError(`the manifest of ${templateId}`, answer.status, token !== null));
  const bytes = new Uint8Array(await answer.arrayBuffer());
  return { bytes, seconds: now() - t0 };
}

/** The manifest of ``templateId`` (its bytes parsed with the page's limits): ``fetched`` (fetchManifestBytes's, the
 *  page's prefetch) or fetched now. */
export async function fetchManifest(origin, templateId, modelId, token = null, fetched = null) {
  const { bytes } = fetched ?? await fetchManifestBytes(origin, templateId, token);
  const manifest = parseManifestBytes(bytes, { templateId, modelId });
  return { manifest, raw: JSON.parse(new TextDecoder().decode(bytes)), bytes };
}

/** The representation names every shard of ``raw`` offers, in ladder order, each with its stated edit PSNR. */
export function templateLevels(raw) {
  const held = raw.shards.map((s) => new Set(s.representations.map((r) => r.name)));
  const first = raw.shards[0].representations;
  return first.filter((r) => held.every((h) => h.has(r.name))).map((r) => ({ name: r.name, psnr_db: r.psnr_db ?? null }));
}

async function templateKV(origin, templateId, index, steps, split, level, onProgress, token, anyMode) {
  const { manifest, raw, bytes } = await fetchManifest(origin, templateId, index.model_id, token);
  const refs = manifest.references.length;
  if (manifest.kvMode === "per-step") checkSchedule(templateId, raw.schedule, steps);
  const want = [index.grid[0] * refs, index.grid[1]];
  if (raw.token_grid.join("x") !== want.join("x")) throw new Error(`template grid ${raw.token_grid} is not ${refs} reference(s) of the model's ${index.grid}`);
  if (split > 0 && manifest.kvMode !== "single" && !anyMode) throw new Error(`template ${templateId} is ${manifest.kvMode}: the page computes template layers for single-KV templates only (choose split 0)`);
  if (split > 0 && refs > 1) throw new Error(`template ${templateId} has ${refs} references: the page computes template layers for one-reference templates only (choose split 0)`);
  // the hybrid split: only the shards of layers >= split are fetched (each shard wholly on one side)
  const shards = raw.shards.filter((x) => x.layers[0] >= split);
  const across = raw.shards.find((x) => x.layers[0] < split && x.layers[1] >= split);
  if (across !== undefined) throw new Error(`shard of layers ${across.layers} straddles the split at layer ${split}`);
  const sizes = new Map();
  for (const shard of raw.shards) for (const rep of shard.representations) sizes.set(rep.digest, rep.bytes);
  const { digests } = templatePlan({ ...raw, shards }, level); // refuses a level a shard lacks before any fetch
  let fetched = 0;
  let bytesFetched = 0;
  const total = digests.length;
  const get = async (digest) => {
    const blob = await fetchShard(origin, digest, sizes.get(digest), { token });
    bytesFetched += blob.byteLength;
    onProgress("fetched", ++fetched, total);
    return blob;
  };
  // split = layers (every layer computed here): nothing to fetch, each step's layers all come from the template pass
  const kv = shards.length === 0 ? Array.from({ length: manifest.kvMode === "per-step" ? steps : 1 }, () => [])
    : await decodeTemplate({ ...raw, shards }, get, level);
  const tokens = raw.token_grid[0] * raw.token_grid[1];
  const perStep = kv.map((parts) => layersOf(parts, index, split, tokens));
  onProgress("decoded", index.layers - split, index.layers - split);
  return { perStep, kvMode: manifest.kvMode, bytesFetched, manifestBytes: bytes.byteLength, shards: total, tokens,
    references: refs, templateImage: raw.template_image, names: kv.map((parts) => parts.map((p) => p.name)),
    levels: templateLevels(raw) };
}

const authHeaders = (token) => (token ? { Authorization: `Bearer ${token}` } : {});

/** A failed answer's message; 401 / 429 say what the user can do about the read token (``sent``: one was sent). */
export function answerError(what, status, sent = false) {
  if (status === 401 && !sent) return `${what} answered 401: this server needs a read token (enter it in the token field, or open the page as /phone#token=TOKEN)`;
  if (status === 401) return `${what} answered 401: the read token was refused (check it with the server's operator)`;
  if (status === 429) return `${what} answered 429: too many wrong tokens from here; wait a minute, then enter the right one`;
  return `${what} answered ${status}`;
}

/** A per-step template runs only the schedule it was computed for (run_edit's check, the same tolerance). */
export function checkSchedule(templateId, schedule, steps) {
  const want = flowTimes(steps).slice(0, steps);
  const got = schedule.timesteps.map(Number);
  if (got.length !== steps || got.some((t, i) => Math.abs(t - want[i]) > 1e-6)) {
    throw new Error(`template ${templateId} was computed for ${got.length} steps at t=${got.map((t) => t.toFixed(4))}; ` +
      `this edit runs ${steps} steps: run it with the template's steps`);
  }
}

/** One step's decoded shards (float16 bits) -> per layer {k, v} float32, each (tokens, heads, head_dim). */
function layersOf(parts, index, split, tokens) {
  const table = f16Table();
  const layers = new Array(index.layers);
  const per = tokens * index.heads * index.head_dim; // one layer's K (or V), (tokens, heads, head_dim)
  for (const part of parts) {
    const count = part.k.length / per; // a shard holds layers [first, first + count)
    if (!Number.isInteger(count) || count < 1) throw new Error(`shard of layer ${part.layers[0]}: ${part.k.length} values is not whole layers of ${per}`);
    for (let i = 0; i < count; i++) {
      const k = new Float32Array(per);
      const v = new Float32Array(per);
      for (let j = 0; j < per; j++) {
        k[j] = table[part.k[i * per + j]];
        v[j] = table[part.v[i * per + j]];
      }
      layers[part.layers[0] + i] = { k, v };
    }
  }
  const have = layers.slice(split).filter(Boolean).length;
  if (layers.length !== index.layers || have !== index.layers - split) throw new Error(`the template has KV for ${have} of layers ${split}..${index.layers - 1}`);
  return layers;
}

/** The template's tokens as the template graphs take them: its image (a blob like the shards) decoded and packed
 * (patch, then zeros), (1, image tokens, in_channels) float32; and the image's bytes on the wire. */
export async function templateTokens(origin, image, index, token) {
  const t0 = now();
  let firstByteS = null; // its round trip as measured: request to first chunk (the estimator's seed takes it off)
  const blob = await fetchShard(origin, image.digest, image.bytes, { token, onChunk: () => { firstByteS ??= now() - t0; } });
  const seconds = now() - t0;
  const bitmap = await createImageBitmap(new Blob([blob], { type: "image/png" }),
    { colorSpaceConversion: "none", premultiplyAlpha: "none" });
  const s = index.image_size;
  if (bitmap.width !== s || bitmap.height !== s) throw new Error(`the template image is ${bitmap.width}x${bitmap.height}, not the model's ${s}x${s}`);
  const ctx = new OffscreenCanvas(s, s).getContext("2d");
  ctx.drawImage(bitmap, 0, 0);
  const patches = packImage(ctx.getImageData(0, 0, s, s).data, index);
  const pd = index.in_channels / 2;
  const tokens = new Float32Array(index.image_tokens * 2 * pd);
  for (let i = 0; i < index.image_tokens; i++) tokens.set(patches.subarray(i * pd, (i + 1) * pd), i * 2 * pd);
  return { tokens, bytes: blob.byteLength, seconds, firstByteS: firstByteS ?? seconds };
}

/** The template's own K/V for layers < split, computed here: one run of the template graph on its tokens. */
async function deviceKV(origin, image, index, templateRun, token) {
  const { tokens, bytes } = await templateTokens(origin, image, index, token);
  const { session, ort } = templateRun;
  const out = await session.run({ template: new ort.Tensor("float32", tokens, [1, index.image_tokens, index.in_channels]) });
  const g = index.template_graph;
  return { layers: Array.from({ length: g.split_layer }, (_, l) => ({ k: out[`k_ref_${l}`].data, v: out[`v_ref_${l}`].data })),
    bytes };
}

/** The hook of the template pass (template_pass.js): layers < split of each step's KV (one step in single mode, at
 * the reference time; every step at its own time in per-step mode) computed layer by layer into ``kv.perStep``. */
async function passKV(origin, kv, index, templatePass, split, times, token) {
  const { tokens, bytes } = await templateTokens(origin, kv.templateImage, index, token);
  for (const [step, layers] of kv.perStep.entries()) {
    const pass = await templatePass.begin(tokens, kv.kvMode === "per-step" ? times[step] : null);
    try {
      for (let l = 0; l < split; l++) {
        const { k, v } = await pass.next();
        layers[l] = { k, v };
      }
    } finally {
      pass.dispose();
    }
  }
  return bytes;
}

/**
 * Edit ``rgba`` (image_size^2 RGBA bytes) against ``templateId`` on ``origin``; ``model`` from loadWebModel, ``run``
 * from createSession. Returns {rgba, report}. ``onProgress(phase, done, total)``: fetched / decoded / computed.
 * ``level``: the representation every shard is fetched at (a name of templateLevels: "fp16", "sakura-l4", a
 * cachegen level...), or a function ({layers, step}) -> name choosing per shard (a fetch policy). ``templatePass``
 * (template_pass.js): layers < split computed layer by layer, any split. ``onKV(perStep)``: the run's K/V once ready.
 * ``policy`` ("on-device" | "fetch-fp16" | "sakura"): the page's pipelined lanes instead, driven by that policy
 * (lanes/page_edit.js: ``memoryBudgetBytes``, ``onEvent``, ``templatePass``; ``level`` and ``split`` unused).
 */
export async function runEdit(args) {
  if (args.policy !== undefined && args.policy !== null) return (await import("./lanes/page_edit.js")).runLanesEdit(args);
  const { origin, templateId, rgba, prompt, steps, seed, model, run, token = null, split = 0, templateRun = null,
    templatePass = null, level = "fp16", onProgress = () => {}, onKV = null } = args;
  const { index } = model;
  const t0 = now();
  const graphSplit = templateRun !== null && split === index.template_graph?.split_layer; // one run of the split graph
  if (templatePass !== null ? !(Number.isInteger(split) && split >= 0 && split <= index.layers) : split !== 0 && !graphSplit) {
    const offered = templatePass !== null ? `0..${index.layers} (the template pass)` : index.split_layers.join(", ");
    throw new Error(`split ${split}: this model's files offer splits ${offered}`);
  }
  const kv = await templateKV(origin, templateId, index, steps, split, level, onProgress, token, templatePass !== null);
  const tFetch = now();
  let tTemplate = tFetch;
  if (split > 0) {
    if (graphSplit && kv.kvMode === "single") {
      const mine = await deviceKV(origin, kv.templateImage, index, templateRun, token);
      mine.layers.forEach((layer, l) => { kv.perStep[0][l] = layer; });
      kv.bytesFetched += mine.bytes;
    } else {
      kv.bytesFetched += await passKV(origin, kv, index, templatePass, split, flowTimes(steps), token);
    }
    tTemplate = now();
    onProgress("template layers", split, split);
  }
  if (onKV !== null) onKV(kv.perStep); // every step's K/V per layer, as the steps read it (inspection; the heap test's leak)
  const dit = new DitSteps({ model, run, rgba, prompt, steps, seed });
  const stepS = [];
  for (let step = 0; step < steps; step++) {
    const s0 = now();
    await dit.step(step, kv.perStep[kv.kvMode === "per-step" ? step : 0]);
    stepS.push(now() - s0);
    onProgress("computed", step + 1, steps);
  }
  const done = now();
  const levelName = typeof level === "string" ? level : "per-shard";
  const report = {
    template_id: templateId,
    model_id: index.model_id,
    steps,
    seed,
    policy: split > 0 ? `${levelName} for layers >= ${split}, layers < ${split} computed here` : `${levelName} for every layer`,
    kv_mode: kv.kvMode,
    split_layer: split,
    template_pass: split > 0 && !(graphSplit && kv.kvMode === "single"), // layers < split computed by template_pass.js
    level: levelName,
    level_psnr_db: kv.levels.find((l) => l.name === levelName)?.psnr_db ?? null,
    shard_levels: kv.names,
    references: kv.references,
    bytes_fetched: kv.bytesFetched,
    manifest_bytes: kv.manifestBytes,
    shards: kv.shards,
    timings_s: { fetch_decode: tFetch - t0, template_layers: tTemplate - tFetch, compute: done - tFetch, total: done - t0, per_step: stepS },
    executed_on: executedOn(run),
  };
  return { rgba: dit.rgba(), report };
}

/** Where an edit ran: the browser, the execution provider and why the others did not, the device. */
export function executedOn(run) {
  return {
    kind: "browser",
    browser: navigator.userAgent,
    execution_provider: run.ep,
    providers_tried: run.tried,
    device: { platform: navigator.platform, cores: navigator.hardwareConcurrency ?? null,
      cross_origin_isolated: globalThis.crossOriginIsolated === true },
  };
}
