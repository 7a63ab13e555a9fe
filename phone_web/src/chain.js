// A representation's chain of blobs, checked link by link and decoded (docs/format.md section 6;
// sakura_core/kv/chain.py): one codec, one shard, strictly increasing levels, each refinement naming the sha256 of
// the blob before it; a cross-step residual or closed-loop twin adds its reference, scaled per channel by the
// predictor its base carries. Never a tensor that was not checked.
import C from "./format_constants.js";
import { MissingReferenceError, ShardChainError, UnknownCodecError } from "./errors.js";
import { f16Table, f32ToF16 } from "./f16.js";
import { parseShard, sameShard } from "./container.js";
import { sha256Hex } from "./digest.js";
import { decodeFp16, decodeInt4, decodeInt8 } from "./plain_codecs.js";
import { decodeSakura, sakuraFinish, sakuraStep } from "./sakura_codec.js";
import { decodeCachegen } from "./cachegen.js";

/** The codecs this client decodes, with whether a representation may be a chain of several blobs. */
export const CODECS = {
  fp16: { progressive: false, decode: decodeFp16 },
  int8: { progressive: false, decode: decodeInt8 },
  int4: { progressive: false, decode: decodeInt4 },
  sakura: { progressive: true, decode: decodeSakura, step: sakuraStep, finish: sakuraFinish },
  cachegen: { progressive: false, decode: decodeCachegen },
};

async function checkLink(index, header, first, prev, prevBlob) {
  if (first === null) {
    if (header.parent !== null) {
      throw new ShardChainError(`first blob (${header.codec} level ${header.level}) refines another: pass its base first`);
    }
    if (!(header.codec in CODECS)) throw new UnknownCodecError(`shard codec ${JSON.stringify(header.codec)} is not known`);
    return;
  }
  if (header.refScale !== null) {
    throw new ShardChainError(`blob ${index} (level ${header.level}) is a refinement carrying a predictor scale`);
  }
  if (header.codec !== first.codec) {
    throw new ShardChainError(`blob ${index} is codec ${header.codec}, the chain's base is ${first.codec}`);
  }
  if (!CODECS[first.codec].progressive) {
    throw new ShardChainError(`codec ${first.codec} is not progressive: a representation is exactly one blob`);
  }
  if (!sameShard(header, first)) throw new ShardChainError(`blob ${index} belongs to another shard`);
  if (header.level <= prev.level) {
    throw new ShardChainError(`blob ${index} has level ${header.level}, not above the previous level ${prev.level}`);
  }
  if (header.parent !== (await sha256Hex(prevBlob))) {
    throw new ShardChainError(`blob ${index} (level ${header.level}) does not refine the blob before it`);
  }
}

/** Parse and cross-check a chain (Uint8Array blobs, base first): [{header, sections}, ...]. */
export async function parseChain(blobs) {
  if (blobs.length === 0) throw new ShardChainError("decode needs at least one blob (the base of the representation)");
  const parsed = [];
  for (let i = 0; i < blobs.length; i++) {
    const { header, sections } = parseShard(blobs[i]);
    const first = parsed.length ? parsed[0].header : null;
    const prev = parsed.length ? parsed[parsed.length - 1].header : null;
    await checkLink(i, header, first, prev, i ? blobs[i - 1] : null);
    parsed.push({ header, sections });
  }
  return parsed;
}

/** The shard's KV from its decoded chain: itself, or for a residual ``a * reference + decoded`` (float16 bits).
 * ``reference``: {step, digest, k, v} (k, v: Uint16Array float16 bits) or null. */
export function applyReference(header, k, v, reference, scale) {
  if (header.refStep === null) return { k, v };
  if (reference === null || reference === undefined) {
    throw new MissingReferenceError(
      `layers ${header.layerFirst}-${header.layerLast} of step ${header.step} are coded against step ` +
        `${header.refStep}, which is not decoded: decode that shard first, or fetch a self-contained representation`,
    );
  }
  if (reference.step !== header.refStep || reference.digest !== header.refDigest) {
    throw new ShardChainError(
      `step ${header.step} is coded against step ${header.refStep} shard ${header.refDigest.slice(0, 12)}…, but the ` +
        `reference given is step ${reference.step} shard ${String(reference.digest).slice(0, 12)}…`,
    );
  }
  const n = header.numElements;
  if (reference.k.length !== n || reference.v.length !== n) {
    throw new ShardChainError(`reference KV has ${reference.k.length} values, the shard needs ${n}`);
  }
  const [nL, t, h, d] = header.shape;
  const tab = f16Table();
  const add = (ref, res, tensor) => {
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) {
      let x = tab[ref[i]];
      if (scale !== null) {
        const layer = Math.floor(i / (t * h * d));
        const code = (scale[((tensor * nL + layer) * h + (Math.floor(i / d) % h)) * d + (i % d)] << 24) >> 24;
        x = Math.fround(x * Math.fround(1 + code / C.predictor.SCALE_DENOM));
      }
      out[i] = f32ToF16(Math.fround(x + tab[res[i]]));
    }
    return out;
  };
  return { k: add(reference.k, k, 0), v: add(reference.v, v, 1) };
}

/** Validate and decode a chain; returns {header (the top blob's), k, v} (float16 bits, (layers, tokens, heads,
 * head_dim)). ``reference``: the decoded reference of a cross-step residual or closed-loop twin. */
export async function decodeChain(blobs, reference = null) {
  const parsed = await parseChain(blobs);
  const header = parsed[parsed.length - 1].header;
  if (header.refStep === null && reference !== null) {
    throw new ShardChainError(`a self-contained shard (step ${header.step}) was given a reference to add`);
  }
  const { k, v } = CODECS[header.codec].decode(parsed);
  return { header, ...applyReference(header, k, v, reference, parsed[0].header.refScale) };
}

/** The zero-byte reuse rung: the reference shard's KV as the client holds it, once it is the one the manifest's
 * ``ref`` names ({step, digest}); nothing is fetched or decoded. */
export function reuseReference(ref, reference) {
  if (reference === null || reference === undefined) {
    throw new MissingReferenceError(`the reuse rung needs step ${ref.step}'s KV: decode that shard first`);
  }
  if (reference.step !== ref.step || reference.digest !== ref.digest) {
    throw new ShardChainError(`the reuse rung names step ${ref.step} shard ${ref.digest.slice(0, 12)}…, not the one given`);
  }
  return { k: reference.k, v: reference.v };
}

/** Incremental decoder of one shard's chain (sakura_core/kv/chain.ChainDecoder): ``push`` blobs in chain order (each
 * parsed, linked, checked by the caller's ``check(header)`` and, for SAKURA, applied at once: an upgrade applies only
 * its new blobs), ``tensors()`` at any point. A rejected blob leaves the decoder as it was. */
export class ChainDecoder {
  constructor(reference = null) {
    this.blobs = [];
    this.parsed = [];
    this.state = null;
    this.reference = reference;
  }

  get header() {
    return this.parsed.length ? this.parsed[this.parsed.length - 1].header : null;
  }

  async push(blob, check = null) {
    const { header, sections } = parseShard(blob);
    const first = this.parsed.length ? this.parsed[0].header : null;
    await checkLink(this.parsed.length, header, first, this.header, this.blobs[this.blobs.length - 1] ?? null);
    if (check !== null) check(header);
    const codec = CODECS[header.codec];
    if (codec.step) this.state = codec.step(this.state, header, sections);
    this.blobs.push(blob);
    this.parsed.push({ header, sections });
    return header;
  }

  tensors() {
    if (!this.parsed.length) throw new ShardChainError("no blob pushed yet: push the representation's base first");
    const header = this.header;
    const codec = CODECS[header.codec];
    const { k, v } = codec.step ? codec.finish(this.state, header) : codec.decode(this.parsed);
    return applyReference(header, k, v, this.reference, this.parsed[0].header.refScale);
  }
}
