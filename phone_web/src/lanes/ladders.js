// The page's fetch plan, as sakura_core/policy/ladder.py rungs_from_manifest and policy/plan.py plan_fetch: per
// shard (g = step * L + layer; one layer per shard) the levels a policy of a family may fetch, cheapest first, as
// policy Levels, their manifest representations, and the quality floor. Per-step templates keep cross-step levels:
// a residual level names its reference step (refStep: the same layer of that step, decoded with it), a level's
// closed-loop twin rides with it (Level.closed; its manifest entry reps[g][i].closedTwin, fetched in its place on its
// track: fetch_lane.js), and the zero-byte `reuse` representation is no rung (as in Python). The floor is Python's:
// the cheapest level whose stated edit PSNR (shard 0's) reaches 35 dB, else the exact one; lower on the twins' track
// where their PSNR reaches it there (the levels below the open-loop floor then fetch that floor off their track:
// Level.offTrack).

export const FLOOR_PSNR_DB = 35.0; // sakura_core/policy/plan.py FLOOR_PSNR_DB
export const DECODE_BYTES_PER_S = 6e8; // plan_fetch's default decode rate (bytes of fp16 KV per second)
export const CLOSED_SUFFIX = "+cl"; // sakura_core/kv/names.py: a closed-loop twin's name is its level's and this

const refMode = (r) => (r.ref ?? null)?.mode ?? null;
const nameKey = (r) => [r.name === "fp16" ? 1 : 0, r.level ?? -1];
const byKey = (a, b) => { const x = nameKey(a); const y = nameKey(b); return x[0] - y[0] || x[1] - y[1]; };
const rated = (p) => p !== undefined && p !== null;

/** The level a twin's name belongs to (``sakura-l2+cl`` -> ``sakura-l2``; names.py base_level_name). */
export const baseLevelName = (name) => (name.endsWith(CLOSED_SUFFIX) ? name.slice(0, -CLOSED_SUFFIX.length) : name);

/** The indices of ``names`` a policy of ``family`` fetches (plan.py policy_levels for fp16 / sakura). */
export function familyLevels(names, family, psnr = {}) {
  if (family === "fp16") {
    if (names.includes("fp16")) return [names.indexOf("fp16")];
    let best = names.length - 1;
    let bestPsnr = -Infinity;
    names.forEach((n, i) => { if (rated(psnr[n]) && psnr[n] >= bestPsnr) { best = i; bestPsnr = psnr[n]; } });
    return [best];
  }
  return names.map((_, i) => i);
}

/** The cheapest of ``names`` whose ``psnr[name]`` reaches the floor; the last when none does (plan.py floor_index). */
export function floorIndexOf(names, psnr, floorPsnrDb = FLOOR_PSNR_DB) {
  const i = names.findIndex((n) => rated(psnr[n]) && psnr[n] >= floorPsnrDb);
  return i < 0 ? names.length - 1 : i;
}

/** The cheapest of ``reps`` (ladder order) whose psnr_db reaches the floor; the last when none does. */
export function floorIndex(reps, floorPsnrDb = FLOOR_PSNR_DB) {
  return floorIndexOf(reps.map((r) => r.name), Object.fromEntries(reps.map((r) => [r.name, r.psnr_db])), floorPsnrDb);
}

/** A level's output MSE share per shard (ladder.py _mse): from its stated PSNR, else its distortion. */
const mseOf = (r, n) => (rated(r.psnr_db) ? (4 * 10 ** (-r.psnr_db / 10)) / n : (Number(r.distortion ?? 0) ** 2) / n);

/** One shard's rungs (ladder.py _shard_ladder): [{level, rep}], rep a copy of the manifest entry with its closed-loop
 *  twin's entry (closedTwin, or null). */
function shardRungs(shard, decodeS, n) {
  const twins = new Map(shard.representations.filter((r) => refMode(r) === "closed").map((r) => [baseLevelName(r.name), r]));
  const own = shard.representations.filter((r) => !["reuse", "closed"].includes(refMode(r))).sort(byKey);
  const byDigest = new Map(own.map((r) => [r.digest, r]));
  const rungs = [];
  let prev = 0;
  for (const r of own) {
    const chain = (r.requires ?? []).reduce((s, d) => s + (byDigest.get(d)?.bytes ?? 0), 0) + r.bytes;
    const progressive = (r.requires ?? []).length > 0;
    const twin = twins.get(r.name) ?? null;
    const closed = twin === null ? null : Object.freeze({ name: twin.name, nbytes: twin.bytes, incrementBytes: twin.bytes,
      decodeS: decodeS(twin.name), mse: mseOf(twin, n), progressive: false, refStep: twin.ref.step, reuse: false, closed: null,
      offTrack: null });
    const level = Object.freeze({ name: r.name, nbytes: chain, incrementBytes: progressive ? r.bytes : chain,
      decodeS: decodeS(r.name), mse: mseOf(r, n), progressive: progressive && chain > prev, refStep: r.ref?.step ?? null,
      reuse: false, closed, offTrack: null });
    rungs.push({ level, rep: { ...r, closedTwin: twin } });
    prev = chain;
  }
  return rungs;
}

/** Per slot name the PSNR of its track (plan.py track_psnr): its closed-loop twins' where the template has them,
 *  else the level's own (the first shard's that states one). */
function trackPsnr(rungs) {
  const own = {};
  const twins = {};
  for (const ladder of rungs) {
    for (const { rep } of ladder) {
      if (rep.closedTwin !== null && rated(rep.closedTwin.psnr_db)) twins[rep.name] = rep.closedTwin.psnr_db;
      if (rated(rep.psnr_db) && !(rep.name in own)) own[rep.name] = rep.psnr_db;
    }
  }
  return { ...own, ...twins };
}

/** {ladders, reps, floor (one per shard), layers, steps, perStep} of ``raw`` (the manifest JSON) for ``family``; a
 *  level's decodeS is a shard's fp16 K/V bytes at ``decodeRates[name]`` (bytes/s: the page's measured rate,
 *  MeasuredProfile.decodeRates), DECODE_BYTES_PER_S where the page has not decoded the level yet. */
export function pageLadders(raw, family, decodeRates = {}) {
  const L = raw.num_layers;
  const perStep = (raw.kv_mode ?? "single") === "per-step";
  const steps = perStep ? raw.schedule.steps : 1;
  const n = steps * L; // a level's output MSE is shared out over every shard
  const [rows, cols] = raw.token_grid;
  const fp16Bytes = 2 * rows * cols * raw.heads * raw.head_dim * 2; // K and V of one layer in fp16
  const decodeS = (name) => fp16Bytes / (decodeRates[name] ?? DECODE_BYTES_PER_S);
  let rungs = new Array(n).fill(null);
  for (const shard of raw.shards) {
    const [first, last] = shard.layers;
    if (first !== last) throw new Error(`the page's lanes fetch one layer per shard; shard ${first}-${last} groups layers (run it at a fixed level)`);
    const g = perStep ? shard.step * L + first : first;
    if (rungs[g] !== null) throw new Error(`the manifest has two shards for shard ${g}`);
    rungs[g] = shardRungs(shard, decodeS, n);
    if (!rungs[g].length) throw new Error(`shard ${g} offers no level to fetch (only reuse rungs or twins)`);
  }
  const missing = rungs.flatMap((x, g) => (x === null ? [g] : []));
  if (missing.length) throw new Error(`the manifest lacks shards ${missing.join(", ")} (g = step * ${L} + layer)`);
  const keep = familyLevels(rungs[0].map((r) => r.level.name), family, trackPsnr(rungs));
  rungs = rungs.map((ladder, g) => keep.map((i) => {
    if (ladder[i] === undefined || ladder[i].level.name !== rungs[0][i].level.name) {
      throw new Error(`shard ${g} offers levels ${ladder.map((r) => r.level.name).join(", ")}, shard 0 ${rungs[0].map((r) => r.level.name).join(", ")}: the page's lanes need the same levels in every shard (a full store)`);
    }
    return ladder[i];
  }));
  const names = rungs[0].map((r) => r.level.name);
  let floor = floorIndexOf(names, Object.fromEntries(rungs[0].map((r) => [r.rep.name, r.rep.psnr_db])));
  const track = floorIndexOf(names, trackPsnr(rungs));
  if (track < floor) { // the twins reach the target lower: the floor on their track, the open-loop one off it
    const at = floor;
    rungs = rungs.map((ladder) => ladder.map((r, j) => (r.level.closed !== null && j < at
      ? { level: Object.freeze({ ...r.level, offTrack: at }), rep: r.rep } : r)));
    floor = track;
  }
  return { ladders: rungs.map((l) => l.map((r) => r.level)), reps: rungs.map((l) => l.map((r) => r.rep)),
    floor: new Array(n).fill(floor), layers: L, steps, perStep };
}
