// A shard's blobs must be the ones its manifest slot needs (sakura_core/kv/binding.py): every blob's header names the
// slot's template, model, layers, codec and geometry (checked before it is decompressed), the top one its step,
// reference and level too; otherwise ShardBindingError (a ShardCorruptError: the shard is treated as corrupt).
import { ShardBindingError } from "./errors.js";
import { ChainDecoder } from "./chain.js";

const SINGLE_LEVEL = new Set(["fp16", "int8", "int4"]);
const DECODED_REF_MODES = ["residual", "closed"];

/** The codec's name of a level (Codec.level_name): ``fp16``, ``int8``, ``int4``; ``sakura-l3``. */
export function levelName(codec, level) {
  return SINGLE_LEVEL.has(codec) ? codec : `${codec}-l${level}`;
}

/** The slot of representation ``rep`` in the (parsed) manifest's shard holding ``layer`` (at ``step``, per-step). */
export function slotFromManifest(manifest, layer, rep, step = null) {
  for (const shard of manifest.shards) {
    const [first, last] = shard.layers;
    if (first <= layer && layer <= last && (shard.step ?? null) === step) {
      const ref = rep.ref ?? null;
      return {
        templateId: manifest.template_id ?? manifest.templateId, modelId: manifest.model_id ?? manifest.modelId,
        layers: [first, last], codec: rep.codec || manifest.codec, levelName: rep.name.replace(/\+cl$/, ""),
        tokenGrid: manifest.token_grid ?? manifest.tokenGrid ?? null, heads: manifest.heads ?? null,
        headDim: manifest.head_dim ?? manifest.headDim ?? null, step,
        reference: ref && DECODED_REF_MODES.includes(ref.mode) ? [ref.step, ref.digest] : null,
      };
    }
  }
  throw new Error(`the manifest has no shard holding layer ${layer}${step === null ? "" : ` at step ${step}`}`);
}

function identityProblems(h, slot) {
  const p = [];
  if (h.templateId !== slot.templateId) p.push(`template ${h.templateId} (expected ${slot.templateId})`);
  if (h.modelId !== slot.modelId) p.push(`model ${h.modelId.slice(0, 12)}…`);
  if (h.layerFirst !== slot.layers[0] || h.layerLast !== slot.layers[1]) p.push(`layers ${h.layerFirst}-${h.layerLast}`);
  if (slot.tokenGrid && (h.tokenGrid[0] !== slot.tokenGrid[0] || h.tokenGrid[1] !== slot.tokenGrid[1])) p.push("token grid");
  if (slot.heads !== null && h.heads !== slot.heads) p.push(`heads ${h.heads}`);
  if (slot.headDim !== null && h.headDim !== slot.headDim) p.push(`head_dim ${h.headDim}`);
  return p;
}

function raiseIf(problems) {
  if (problems.length) {
    throw new ShardBindingError(`shard does not belong where the manifest puts it: its header says ${problems.join(", ")}`);
  }
}

/** Any blob of the slot's chain, before it is decompressed. */
export function checkShardGeometry(header, slot) {
  const p = identityProblems(header, slot);
  if (header.codec !== slot.codec) p.push(`codec ${header.codec} (expected ${slot.codec})`);
  raiseIf(p);
}

/** The chain's top blob: identity, step, reference and level. */
export function checkShardBinding(header, slot) {
  const p = identityProblems(header, slot);
  if (header.step !== slot.step) p.push(`step ${header.step} (expected ${slot.step})`);
  const ref = header.refStep === null ? null : [header.refStep, header.refDigest];
  if ((ref === null) !== (slot.reference === null) || (ref && (ref[0] !== slot.reference[0] || ref[1] !== slot.reference[1]))) {
    p.push("reference");
  }
  if (header.codec !== slot.codec) p.push(`codec ${header.codec} (expected ${slot.codec})`);
  else if (levelName(header.codec, header.level) !== slot.levelName) p.push(`level ${levelName(header.codec, header.level)}`);
  raiseIf(p);
}

/** Decode a representation's chain for its manifest slot, as the Python runtime's decode lane does: each blob pushed
 * with the slot's geometry check, the top one bound to the slot, then the reference added. */
export async function decodeForSlot(blobs, slot, reference = null) {
  const dec = new ChainDecoder();
  for (const blob of blobs) await dec.push(blob, (header) => checkShardGeometry(header, slot));
  checkShardBinding(dec.header, slot);
  dec.reference = reference;
  return { header: dec.header, ...dec.tensors() };
}
