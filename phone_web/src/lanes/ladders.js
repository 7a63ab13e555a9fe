// The page's fetch plan, as sakura_core/policy/ladder.py ladders_from_manifest and policy/plan.py plan_fetch: per
// shard (g = step * L + layer; one layer per shard) the levels a policy of a family may fetch, cheapest first, as
// policy Levels, their manifest representations, and the quality floor (the cheapest level whose stated edit PSNR
// reaches 35 dB, else the exact one). The page's lanes offer the self-contained levels only: a representation with a
// cross-step reference (residual, closed-loop twin, reuse) is left out of the ladders (templatePlan still decodes
// them at a fixed level).

export const FLOOR_PSNR_DB = 35.0; // sakura_core/policy/plan.py FLOOR_PSNR_DB
export const DECODE_BYTES_PER_S = 6e8; // plan_fetch's default decode rate (bytes of fp16 KV per second)

const nameKey = (r) => [r.name === "fp16" ? 1 : 0, r.level ?? -1];
const byKey = (a, b) => { const x = nameKey(a); const y = nameKey(b); return x[0] - y[0] || x[1] - y[1]; };

/** The indices of ``names`` a policy of ``family`` fetches (plan.py policy_levels for fp16 / sakura). */
export function familyLevels(names, family, psnr = {}) {
  if (family === "fp16") {
    if (names.includes("fp16")) return [names.indexOf("fp16")];
    let best = names.length - 1;
    let bestPsnr = -Infinity;
    names.forEach((n, i) => { if (psnr[n] !== undefined && psnr[n] !== null && psnr[n] >= bestPsnr) { best = i; bestPsnr = psnr[n]; } });
    return [best];
  }
  return names.map((_, i) => i);
}

/** The cheapest of ``reps`` (ladder order) whose psnr_db reaches the floor; the last when none does. */
export function floorIndex(reps, floorPsnrDb = FLOOR_PSNR_DB) {
  const i = reps.findIndex((r) => r.psnr_db !== undefined && r.psnr_db !== null && r.psnr_db >= floorPsnrDb);
  return i < 0 ? reps.length - 1 : i;
}

/** {ladders, reps, floor (one per shard), layers, steps, perStep} of ``raw`` (the manifest JSON) for ``family``; a
 *  level's decodeS is a shard's fp16 K/V bytes at ``decodeRates[name]`` (bytes/s: the page's measured rate,
 *  MeasuredProfile.decodeRates), DECODE_BYTES_PER_S where the page has not decoded the level yet. */
export function pageLadders(raw, family, decodeRates = {}) {
  const L = raw.num_layers;
  const perStep = (raw.kv_mode ?? "single") === "per-step";
  const steps = perStep ? raw.schedule.steps : 1;
  const n = steps * L; // a level's output MSE is shared out over every shard
  const ladders = new Array(n).fill(null);
  const reps = new Array(n).fill(null);
  const [rows, cols] = raw.token_grid;
  for (const shard of raw.shards) {
    const [first, last] = shard.layers;
    if (first !== last) throw new Error(`the page's lanes fetch one layer per shard; shard ${first}-${last} groups layers (run it at a fixed level)`);
    const g = perStep ? shard.step * L + first : first;
    if (ladders[g] !== null) throw new Error(`the manifest has two shards for shard ${g}`);
    const own = shard.representations.filter((r) => (r.ref ?? null) === null).sort(byKey);
    if (!own.length) throw new Error(`shard ${g} has no self-contained representation; the page's lanes cannot fetch it`);
    const psnr = Object.fromEntries(own.map((r) => [r.name, r.psnr_db ?? null]));
    const keep = familyLevels(own.map((r) => r.name), family, psnr);
    const fp16Bytes = 2 * rows * cols * raw.heads * raw.head_dim * 2; // K and V of one layer in fp16
    const byDigest = new Map(own.map((r) => [r.digest, r]));
    const levels = [];
    let prev = 0;
    for (const r of own) {
      const chain = (r.requires ?? []).reduce((s, d) => s + (byDigest.get(d)?.bytes ?? 0), 0) + r.bytes;
      const progressive = (r.requires ?? []).length > 0;
      const mse = r.psnr_db !== undefined && r.psnr_db !== null ? (4 * 10 ** (-r.psnr_db / 10)) / n : (Number(r.distortion ?? 0) ** 2) / n;
      levels.push(Object.freeze({ name: r.name, nbytes: chain, incrementBytes: progressive ? r.bytes : chain,
        decodeS: fp16Bytes / (decodeRates[r.name] ?? DECODE_BYTES_PER_S), mse, progressive: progressive && chain > prev, refStep: null, reuse: false,
        closed: null, offTrack: null }));
      prev = chain;
    }
    ladders[g] = keep.map((i) => levels[i]);
    reps[g] = keep.map((i) => own[i]);
  }
  const missing = ladders.flatMap((x, g) => (x === null ? [g] : []));
  if (missing.length) throw new Error(`the manifest lacks shards ${missing.join(", ")} (g = step * ${L} + layer)`);
  const floor = reps.map((r) => floorIndex(r));
  return { ladders, reps, floor, layers: L, steps, perStep };
}
