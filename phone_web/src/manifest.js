// The manifest parser (docs/format.md section 2): sakura_core/kv/manifest.parse_manifest's checks in its order —
// the schema (manifest_schema.py, manifest_refs.py), the bounds (manifest_limits.py, the numbers from
// format_constants.js), the references, then the template and model asked for — raising ManifestError naming the
// field, ManifestLimitError past a bound, ModelMismatchError for another model. Values come from boundedJson
// (a float is a Number object, an int a plain number, as Python tells them apart).
import C from "./format_constants.js";
import { ManifestError, ManifestLimitError, ModelMismatchError } from "./errors.js";
import { boundedJson } from "./bounded_json.js";

const L = C.limits;
const MAX_BLOB_BYTES = C.container.MAX_BLOB_BYTES;
const { MAX_REFERENCES, REF_TIME_OFFSET } = C.references;
const MULTI = /^flux2-ref-t10-x([2-9])$/;
const MODEL_ID_RE = /^[0-9a-f]{1,128}$/;
const TEMPLATE_ID_RE = /^[a-z0-9-]{1,64}$/;
const DIGEST_RE = /^[0-9a-f]{64}$/;
const REF_MODES = ["residual", "reuse", "closed"];
const CLOSED_SUFFIX = "+cl";

const isDict = (x) => x !== null && typeof x === "object" && !Array.isArray(x) && !(x instanceof Number);
const has = (m, k) => Object.prototype.hasOwnProperty.call(m, k);
const get = (m, k) => (has(m, k) ? m[k] : null); // Python's dict.get: missing and null are both None
const isInt = (x) => typeof x === "number" && Number.isInteger(x);
const isNum = (x) => (typeof x === "number" || x instanceof Number) && Number.isFinite(Number(x));
const isStr = (x) => typeof x === "string";
const isDigest = (x) => isStr(x) && DIGEST_RE.test(x);
const eqNum = (x, n) => (typeof x === "number" || x instanceof Number || typeof x === "boolean") && Number(x) === n;
const show = (x) => JSON.stringify(x)?.slice(0, 120);
const bad = (msg) => new ManifestError(msg);

function atMost(field, value, bound) {
  if (value > bound) throw new ManifestLimitError(`manifest field '${field}' is ${value}, over the limit of ${bound}`);
}

function posInt(m, key) {
  const v = get(m, key);
  if (!isInt(v) || v < 1) throw bad(`manifest field '${key}' must be a positive int, got ${show(v)}`);
  return v;
}

function name(m, key) {
  const v = get(m, key);
  if (!isStr(v) || !v) throw bad(`manifest field '${key}' must be a non-empty string, got ${show(v)}`);
  return v;
}

function checkHeader(m) {
  if (!isDict(m)) throw bad("manifest must be a JSON object");
  if (!eqNum(get(m, "version"), 2) || typeof get(m, "version") === "boolean") {
    throw bad(`manifest field 'version' must be 2, got ${show(get(m, "version"))}` +
      (eqNum(get(m, "version"), 1) ? ": republish the template (sakura precompute ... --overwrite)" : ""));
  }
  const modelId = get(m, "model_id");
  if (!isStr(modelId) || !MODEL_ID_RE.test(modelId)) throw bad("manifest field 'model_id' must be lowercase hex");
  const templateId = get(m, "template_id");
  if (!isStr(templateId) || !TEMPLATE_ID_RE.test(templateId)) throw bad("manifest field 'template_id' must match [a-z0-9-]{1,64}");
  const grid = get(m, "token_grid");
  if (!(Array.isArray(grid) && grid.length === 2 && grid.every((g) => isInt(g) && g > 0))) {
    throw bad(`manifest field 'token_grid' must be [rows, cols] of positive ints, got ${show(grid)}`);
  }
  const header = {
    modelId, templateId, tokenGrid: [grid[0], grid[1]], ropeLayout: name(m, "rope_layout"),
    numLayers: posInt(m, "num_layers"), heads: posInt(m, "heads"), headDim: posInt(m, "head_dim"),
    codec: name(m, "codec"),
  };
  const mode = has(m, "kv_mode") ? m.kv_mode : "single";
  if (mode !== "single" && mode !== "per-step") throw bad(`manifest field 'kv_mode' must be single or per-step, got ${show(mode)}`);
  header.kvMode = mode;
  return header;
}

function checkGeometryLimits(h) {
  const [rows, cols] = h.tokenGrid;
  atMost("token_grid[0]", rows, L.MAX_GRID_SIDE);
  atMost("token_grid[1]", cols, L.MAX_GRID_SIDE);
  atMost("token_grid (rows x cols tokens)", rows * cols, L.MAX_TEMPLATE_TOKENS);
  atMost("num_layers", h.numLayers, L.MAX_LAYERS);
  atMost("heads", h.heads, L.MAX_HEADS);
  atMost("head_dim", h.headDim, L.MAX_HEAD_DIM);
}

function checkSchedule(s) {
  if (!isDict(s)) throw bad("manifest field 'schedule' must be an object in a per-step manifest");
  const steps = get(s, "steps");
  if (!isInt(steps) || steps < 1) throw bad(`manifest field 'schedule.steps' must be a positive int, got ${show(steps)}`);
  const times = get(s, "timesteps");
  const ok = Array.isArray(times) && times.length === steps && times.every((t) => isNum(t) && Number(t) >= 0 && Number(t) <= 1) &&
    times.every((t, i) => i === 0 || Number(times[i - 1]) >= Number(t));
  if (!ok) throw bad(`manifest field 'schedule.timesteps' must be ${steps} non-increasing times in [0, 1]`);
  const shift = get(s, "shift");
  if (!isNum(shift) || Number(shift) <= 0) throw bad("manifest field 'schedule.shift' must be a number > 0");
  const guidance = get(s, "guidance");
  if (guidance !== null && !isNum(guidance)) throw bad("manifest field 'schedule.guidance' must be a number or null");
  const sampler = get(s, "sampler");
  return { steps, timesteps: times.map(Number), shift: Number(shift), guidance: guidance === null ? null : Number(guidance),
    sampler: isStr(sampler) ? sampler : null };
}

function checkBlobRef(image, where = "template_image") {
  if (image === null) return null;
  if (!(isDict(image) && isDigest(get(image, "digest")) && isInt(get(image, "bytes")) && image.bytes > 0)) {
    throw bad(`manifest field '${where}' must be {digest, bytes} of a blob`);
  }
  return [image.digest, image.bytes];
}

// ---- shards ------------------------------------------------------------------------------------------------------

function refMode(rep, w, step) {
  if (!isDict(rep) || get(rep, "ref") === null) return null;
  const ref = rep.ref;
  if (step === null) throw bad(`manifest field '${w}.ref' is set, but cross-step references need a per-step manifest`);
  if (!isDict(ref) || !REF_MODES.includes(get(ref, "mode"))) throw bad(`manifest field '${w}.ref.mode' must be one of ${REF_MODES}`);
  const r = get(ref, "step");
  if (!(isInt(r) && r >= 0 && r < step)) throw bad(`manifest field '${w}.ref.step' must be an earlier step than ${step}`);
  if (!isDigest(get(ref, "digest"))) throw bad(`manifest field '${w}.ref.digest' must be 64 lowercase hex characters`);
  if (ref.mode === "reuse") {
    const level = get(rep, "level");
    if (!isInt(level) || level < 0) throw bad(`manifest field '${w}.level' must be an int >= 0`);
    if (!isStr(get(rep, "name")) || !rep.name) throw bad(`manifest field '${w}.name' must be a non-empty string`);
    const req = get(rep, "requires");
    if (!eqNum(get(rep, "bytes"), 0) || get(rep, "digest") !== null || !(Array.isArray(req) && req.length === 0)) {
      throw bad(`manifest field '${w}': a 'reuse' representation has bytes 0, digest null, requires []`);
    }
  }
  return ref.mode;
}

function checkRepresentation(rep, w) {
  if (!isDict(rep)) throw bad(`manifest field '${w}' must be an object`);
  const level = get(rep, "level");
  if (!isInt(level) || level < 0) throw bad(`manifest field '${w}.level' must be an int >= 0, got ${show(level)}`);
  if (!isStr(get(rep, "name")) || !rep.name) throw bad(`manifest field '${w}.name' must be a non-empty string`);
  const size = get(rep, "bytes");
  if (!isInt(size) || size < 1) throw bad(`manifest field '${w}.bytes' must be a positive int, got ${show(size)}`);
  const dist = get(rep, "distortion");
  if (!isNum(dist) || Number(dist) < 0) throw bad(`manifest field '${w}.distortion' must be a finite number >= 0`);
  if (!isDigest(get(rep, "digest"))) throw bad(`manifest field '${w}.digest' must be 64 lowercase hex characters`);
  const req = get(rep, "requires");
  if (!Array.isArray(req) || !req.every(isStr)) throw bad(`manifest field '${w}.requires' must be a list of digests`);
  if (has(rep, "total_bytes") && (!isInt(rep.total_bytes) || rep.total_bytes < size)) {
    throw bad(`manifest field '${w}.total_bytes' must be an int >= bytes`);
  }
}

function checkChain(rep, byDigest, w) {
  const req = rep.requires;
  for (const r of req) {
    if (!byDigest.has(r)) throw bad(`manifest field '${w}.requires' names ${r.slice(0, 12)}…, not a representation of this shard`);
  }
  let total = rep.bytes;
  if (req.length) {
    const parent = byDigest.get(req[req.length - 1]);
    const want = [...parent.requires, req[req.length - 1]];
    if (want.length !== req.length || want.some((d, i) => d !== req[i])) {
      throw bad(`manifest field '${w}.requires' is not its parent's requires plus the parent`);
    }
    if (parent.level >= rep.level) throw bad(`manifest field '${w}.requires': a representation must refine a lower level`);
    total = req.reduce((a, r) => a + byDigest.get(r).bytes, 0) + rep.bytes;
  }
  if (has(rep, "total_bytes") && rep.total_bytes !== total) throw bad(`manifest field '${w}.total_bytes' is not the chain's ${total}`);
}

function checkRepresentations(reps, where, seen, step) {
  if (!Array.isArray(reps) || reps.length === 0) throw bad(`manifest field '${where}.representations' must be a non-empty list`);
  const byDigest = new Map();
  const levels = [];
  reps.forEach((rep, j) => {
    const w = `${where}.representations[${j}]`;
    if (refMode(rep, w, step) === "reuse") {
      levels.push(rep.level);
      return;
    }
    checkRepresentation(rep, w);
    if (byDigest.has(rep.digest) || seen.has(rep.digest)) throw bad(`manifest field '${w}.digest' appears twice`);
    byDigest.set(rep.digest, rep);
    levels.push(rep.level);
  });
  if (new Set(levels).size !== levels.length) throw bad(`manifest field '${where}.representations' has repeated levels`);
  if (levels.some((l, i) => i && levels[i - 1] > l)) throw bad(`manifest field '${where}.representations' must be in ascending level order`);
  reps.forEach((rep, j) => {
    if (get(rep, "digest") !== null) checkChain(rep, byDigest, `${where}.representations[${j}]`);
  });
  for (const d of byDigest.keys()) seen.add(d);
}

function checkLayerCover(group, numLayers, seen, step) {
  if (group.length === 0) throw bad(`manifest field 'shards' has no shard for step ${step}`);
  let next = 0;
  for (const [i, shard] of group) {
    const where = `shards[${i}]`;
    if (!isDict(shard)) throw bad(`manifest field '${where}' must be an object`);
    const layers = get(shard, "layers");
    if (!(Array.isArray(layers) && layers.length === 2 && layers.every(isInt))) throw bad(`manifest field '${where}.layers' must be [first, last] ints`);
    if (layers[0] !== next || layers[1] < layers[0] || layers[1] >= numLayers) {
      throw bad(`manifest field '${where}.layers' is ${show(layers)}: the shards must cover layers 0..${numLayers - 1} in order`);
    }
    next = layers[1] + 1;
    const exact = get(shard, "exact_digest");
    if (exact !== null && (step === null || !isDigest(exact))) throw bad(`manifest field '${where}.exact_digest' is not allowed here`);
    checkRepresentations(get(shard, "representations"), where, seen, step);
  }
  if (next !== numLayers) throw bad(`manifest field 'shards' covers layers 0..${next - 1}, but num_layers = ${numLayers}`);
}

function checkShards(shards, numLayers, steps) {
  if (!Array.isArray(shards) || shards.length === 0) throw bad("manifest field 'shards' must be a non-empty list");
  const seen = new Set();
  if (steps === null) {
    checkLayerCover(shards.map((s, i) => [i, s]), numLayers, seen, null);
    shards.forEach((s, i) => {
      if (get(s, "step") !== null) throw bad(`manifest field 'shards[${i}].step' is set but kv_mode is 'single'`);
    });
    return;
  }
  const keys = shards.map((s, i) => {
    const step = isDict(s) ? get(s, "step") : null;
    if (!isInt(step) || step < 0) throw bad(`manifest field 'shards[${i}].step' must be an int >= 0 in a per-step manifest`);
    return step;
  });
  if (keys.some((k, i) => i && keys[i - 1] > k) || keys[keys.length - 1] >= steps) throw bad("manifest field 'shards' must be step-major");
  for (let step = 0; step < steps; step++) {
    checkLayerCover(shards.map((s, i) => [i, s]).filter(([i]) => keys[i] === step), numLayers, seen, step);
  }
  checkCrossStepRefs(shards);
}

function checkCrossStepRefs(shards) {
  const exact = new Map();
  const named = new Map();
  const names = new Map();
  const at = (step, layers) => `${step}|${layers[0]},${layers[1]}`;
  for (const sh of shards) {
    const key = at(sh.step, sh.layers);
    names.set(key, new Set(sh.representations.map((r) => r.name)));
    if (get(sh, "exact_digest") !== null) exact.set(key, sh.exact_digest);
    for (const rep of sh.representations) {
      if (get(rep, "codec") === "fp16" && get(rep, "ref") === null) exact.set(key, rep.digest);
      if (get(rep, "digest") !== null) named.set(`${key}|${rep.digest}`, rep.name);
    }
  }
  shards.forEach((sh, i) => sh.representations.forEach((rep, j) => {
    const ref = get(rep, "ref");
    if (ref === null) return;
    const key = at(ref.step, sh.layers);
    const w = `shards[${i}].representations[${j}]`;
    if (ref.mode === "closed") {
      if (!rep.name.endsWith(CLOSED_SUFFIX)) throw bad(`manifest field '${w}.name': a closed-loop representation is named '<level>+cl'`);
      const want = (names.get(key) ?? new Set()).has(rep.name) ? rep.name : rep.name.slice(0, -CLOSED_SUFFIX.length);
      if ((named.get(`${key}|${ref.digest}`) ?? null) !== want) throw bad(`manifest field '${w}.ref' does not name ${want} of step ${ref.step}`);
      return;
    }
    if ((exact.get(key) ?? null) !== ref.digest) throw bad(`manifest field '${w}.ref' does not name the fp16 representation of step ${ref.step}`);
  }));
}

// ---- bounds, references, the typed manifest ------------------------------------------------------------------------

function checkValueLimits(m, h) {
  const profile = has(m, "store_profile") ? m.store_profile : "full";
  if (profile !== "serving" && profile !== "full") throw bad("manifest field 'store_profile' must be one of serving, full");
  const perLayer = h.tokenGrid[0] * h.tokenGrid[1] * h.heads * h.headDim;
  let ladder = null;
  m.shards.forEach((shard, i) => {
    atMost(`shards[${i}].layers (K elements)`, (shard.layers[1] - shard.layers[0] + 1) * perLayer, L.MAX_SHARD_ELEMENTS);
    const reps = shard.representations;
    atMost(`shards[${i}].representations (count)`, reps.length, L.MAX_REPRESENTATIONS);
    reps.forEach((rep, j) => {
      atMost(`shards[${i}].representations[${j}].bytes`, Number(rep.bytes), MAX_BLOB_BYTES);
      const psnr = get(rep, "psnr_db");
      if (psnr !== null && !isNum(psnr)) throw bad(`manifest field 'shards[${i}].representations[${j}].psnr_db' must be a finite number`);
    });
    const names = reps.filter((r) => !["reuse", "closed"].includes(get(get(r, "ref") ?? {}, "mode"))).map((r) => r.name);
    if (ladder === null) ladder = names;
    else if (profile !== "serving" && (names.length !== ladder.length || names.some((n, k) => n !== ladder[k]))) {
      throw bad(`manifest field 'shards[${i}].representations' has another ladder than shard 0: every shard must offer the same`);
    }
  });
  const image = get(m, "template_image");
  if (image !== null) atMost("template_image.bytes", image.bytes, L.MAX_IMAGE_BYTES);
  return profile;
}

function checkReferences(m, grid, ropeLayout) {
  const match = MULTI.exec(ropeLayout);
  let grids = [grid];
  if (match) {
    const n = Number(match[1]);
    if (n > MAX_REFERENCES || grid[0] % n) throw bad(`manifest fields 'token_grid' / 'rope_layout': ${grid[0]} rows do not stack ${n} references`);
    grids = Array.from({ length: n }, () => [grid[0] / n, grid[1]]);
  }
  const templateImage = checkBlobRef(get(m, "template_image"));
  const refs = get(m, "references");
  if (refs === null) {
    if (grids.length > 1) throw bad(`manifest of ${grids.length} references has no 'references' field; republish it`);
    return [{ name: null, size: null, tokenGrid: grid, ropeT: REF_TIME_OFFSET, tokenOffset: 0, tokens: grid[0] * grid[1], image: templateImage }];
  }
  if (!Array.isArray(refs) || refs.length !== grids.length || refs.length > MAX_REFERENCES) {
    throw bad(`manifest field 'references' must list the ${grids.length} reference(s) rope_layout names`);
  }
  const out = [];
  let offset = 0;
  refs.forEach((ref, i) => {
    out.push(checkReference(i, ref, grids[i], offset));
    offset += grids[i][0] * grids[i][1];
  });
  const first = out[0].image;
  if (templateImage !== null && (first === null || first[0] !== templateImage[0] || first[1] !== templateImage[1])) {
    throw bad("manifest field 'template_image' must be references[0].image (the first reference)");
  }
  return out;
}

const pair = (v) => Array.isArray(v) && v.length === 2 && v.every((x) => isInt(x) && x > 0);

function checkReference(i, ref, grid, offset) {
  const where = `references[${i}]`;
  const fields = ["size", "token_grid", "rope_t", "token_offset", "tokens"];
  if (!isDict(ref) || fields.some((k) => !has(ref, k))) throw bad(`manifest field '${where}' must be an object with ${fields}`);
  if (!pair(ref.size) || !pair(ref.token_grid) || ref.token_grid[0] !== grid[0] || ref.token_grid[1] !== grid[1]) {
    throw bad(`manifest field '${where}': size / token_grid must be [S, S] / ${show(grid)}`);
  }
  const expect = { rope_t: REF_TIME_OFFSET * (i + 1), token_offset: offset, tokens: grid[0] * grid[1] };
  for (const [key, want] of Object.entries(expect)) {
    if (!isInt(ref[key]) || ref[key] !== want) throw bad(`manifest field '${where}.${key}' must be ${want}`);
  }
  const nm = get(ref, "name");
  if (nm !== null && !(isStr(nm) && [...nm].length > 0 && [...nm].length <= 64)) throw bad(`manifest field '${where}.name' must be 1-64 characters`);
  return { name: nm, size: ref.size, tokenGrid: grid, ropeT: expect.rope_t, tokenOffset: offset, tokens: expect.tokens,
    image: checkBlobRef(get(ref, "image"), `${where}.image`) };
}

/** The typed manifest of a parsed JSON value, checked as Python's parse_manifest checks it; ``templateId`` and
 * ``modelId`` (optional): the template asked for and the model in use. */
export function parseManifest(m, { templateId = null, modelId = null } = {}) {
  const h = checkHeader(m);
  checkGeometryLimits(h);
  const perStep = h.kvMode === "per-step";
  const schedule = perStep ? checkSchedule(get(m, "schedule")) : null;
  if (schedule !== null) atMost("schedule.steps", schedule.steps, L.MAX_STEPS);
  if (schedule === null && get(m, "schedule") !== null) throw bad("manifest field 'schedule' is only for kv_mode 'per-step'");
  checkShards(get(m, "shards"), h.numLayers, perStep ? schedule.steps : null);
  const image = checkBlobRef(get(m, "template_image"));
  const storeProfile = checkValueLimits(m, h);
  const references = checkReferences(m, h.tokenGrid, h.ropeLayout);
  if (templateId !== null && h.templateId !== templateId) {
    throw bad(`manifest field 'template_id' is ${show(h.templateId)} but template ${show(templateId)} was asked for`);
  }
  if (modelId !== null && h.modelId !== modelId) {
    throw new ModelMismatchError(`template ${show(h.templateId)} was computed for model ${h.modelId}, not for the model in use (${modelId})`);
  }
  return { ...h, schedule, templateImage: image, references, storeProfile, shards: m.shards, raw: m };
}

/** parseManifest of manifest bytes, read by boundedJson (LimitError / JSONValueError before any field is read). */
export function parseManifestBytes(bytes, options = {}) {
  return parseManifest(boundedJson(bytes, "manifest", options), options);
}
