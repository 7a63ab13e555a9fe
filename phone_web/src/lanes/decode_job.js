// One decode of the page's decode lane, a pure function the worker (decode_worker.js) and the in-thread fallback
// share: a shard's chain of blobs decoded for its manifest slot (binding.js decodeForSlot: every blob checked
// against the slot; a cross-step level's reference, {step, digest, k, v} float16 bits, added) and widened from
// float16 bits to float32 K/V, each (tokens, heads, head_dim) of its one layer.
import { decodeForSlot } from "../binding.js";
import { f16Table } from "../f16.js";

export async function decodeJob(blobs, slot, reference = null) {
  const { k, v } = await decodeForSlot(blobs.map((b) => new Uint8Array(b)), slot, reference);
  const table = f16Table();
  const k32 = new Float32Array(k.length);
  const v32 = new Float32Array(v.length);
  for (let i = 0; i < k.length; i++) {
    k32[i] = table[k[i]];
    v32[i] = table[v[i]];
  }
  return { k: k32, v: v32 };
}

/** What a first decode would pay besides the decode: the float16 table built (the modules are imported by then). */
export function warmJob() {
  f16Table();
}
