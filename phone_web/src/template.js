// A whole template decoded at one representation name (sakura_core/kv/template_codec.decode_template /
// decode_per_step): every shard's chain bound to its manifest slot, cross-step references followed — a residual adds
// the reference shard as decoded at the same name, a `reuse` rung takes it whole, a closed-loop twin decodes against
// its track (step 0 at its level, then the twins); name "reuse": step 0 exact (fp16), then each step reuses the one
// before. `getBlob(digest)` returns (or resolves to) the blob's bytes.
import { decodeForSlot, slotFromManifest } from "./binding.js";
import { reuseReference } from "./chain.js";

/** Per step (one entry in single mode), per shard in layer order: {layers, k, v} (float16 bits). */
export async function decodeTemplate(manifest, getBlob, name) {
  const perStep = (manifest.kv_mode ?? "single") === "per-step";
  const steps = perStep ? manifest.schedule.steps : 1;
  const base = name.replace(/\+cl$/, "");
  const decoded = new Map(); // "step|first layer" -> {k, v}
  const out = [];
  for (let s = 0; s < steps; s++) {
    const parts = [];
    for (const shard of manifest.shards.filter((x) => (perStep ? x.step === s : true))) {
      const first = shard.layers[0];
      const want = name === "reuse" && s === 0 ? "fp16" : s === 0 ? base : name;
      const rep = shard.representations.find((r) => r.name === want);
      if (rep === undefined) throw new Error(`shard ${first} of step ${s} has no representation ${want}`);
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
      parts.push({ layers: shard.layers, k: kv.k, v: kv.v });
    }
    out.push(parts);
  }
  return out;
}
