// A whole template decoded at one representation name (sakura_core/kv/template_codec.decode_template /
// decode_per_step): every shard's chain bound to its manifest slot, cross-step references followed — a residual adds
// the reference shard as decoded (at its own name), a `reuse` rung takes it whole, a closed-loop twin decodes against
// its track (step 0 at its level, then the twins); name "reuse": step 0 exact (fp16), then each step reuses the one
// before. `getBlob(digest)` returns (or resolves to) the blob's bytes. The name may also be chosen per shard: a
// function ({layers, step}) -> name (a fetch policy's choice; the rules above apply to each shard's own name).
import { decodeForSlot, slotFromManifest } from "./binding.js";
import { reuseReference } from "./chain.js";

/** The representation each shard decodes from: per step (one entry in single mode), per shard in layer order,
 * {shard, step, name, rep} — and `digests`, every blob the plan fetches (each once, base first per chain). */
export function templatePlan(manifest, name) {
  const perStep = (manifest.kv_mode ?? "single") === "per-step";
  const steps = perStep ? manifest.schedule.steps : 1;
  const nameOf = typeof name === "function" ? name : () => name;
  const plan = [];
  const digests = new Set();
  for (let s = 0; s < steps; s++) {
    const parts = [];
    for (const shard of manifest.shards.filter((x) => (perStep ? x.step === s : true))) {
      const chosen = nameOf({ layers: shard.layers, step: perStep ? s : null });
      if (typeof chosen !== "string") throw new Error(`shard of layers ${shard.layers} (step ${s}): the level must be a representation name, got ${chosen}`);
      const base = chosen.replace(/\+cl$/, "");
      const want = chosen === "reuse" && s === 0 ? "fp16" : s === 0 ? base : chosen;
      const rep = shard.representations.find((r) => r.name === want);
      if (rep === undefined) {
        const offered = [...new Set(shard.representations.map((r) => r.name))].join(", ");
        throw new Error(`shard of layers ${shard.layers} (step ${s}) has no representation ${want}; it offers ${offered}`);
      }
      if ((rep.ref ?? null)?.mode !== "reuse") for (const d of [...rep.requires, rep.digest]) digests.add(d);
      parts.push({ shard, step: s, name: chosen, rep });
    }
    plan.push(parts);
  }
  return { plan, digests: [...digests], perStep };
}

/** Per step (one entry in single mode), per shard in layer order: {layers, k, v, name} (float16 bits). */
export async function decodeTemplate(manifest, getBlob, name) {
  const { plan, perStep } = templatePlan(manifest, name);
  const decoded = new Map(); // "step|first layer" -> {k, v}
  const out = [];
  for (const parts of plan) {
    const got = [];
    for (const { shard, step: s, name: chosen, rep } of parts) {
      const first = shard.layers[0];
      const ref = rep.ref ?? null;
      const held = ref === null ? null : decoded.get(`${ref.step}|${first}`);
      let kv;
      if (ref !== null && ref.mode === "reuse") {
        kv = reuseReference(ref, { step: ref.step, digest: ref.digest, ...held });
      } else {
        const blobs = await Promise.all([...rep.requires, rep.digest].map(getBlob));
        const reference = ref === null ? null : { step: ref.step, digest: ref.digest, ...held };
        kv = await decodeForSlot(blobs, slotFromManifest(manifest, first, rep, perStep ? s : null), reference);
      }
      decoded.set(`${s}|${first}`, { k: kv.k, v: kv.v });
      got.push({ layers: shard.layers, k: kv.k, v: kv.v, name: chosen });
    }
    out.push(got);
  }
  return out;
}
