// zstd frames of an exact size (sakura_core/kv/codec_parts.zstd_exact): the declared content size is read from the
// frame header and checked before anything is decompressed (fzstd decompresses; it decodes python-zstandard's
// frames bit-exact).
import { ShardCorruptError } from "./errors.js";

// a module worker sees no import map: it names fzstd's URL in SAKURA_FZSTD_URL before importing this module
const { decompress } = await import(globalThis.SAKURA_FZSTD_URL ?? "fzstd");

const MAGIC = 0xfd2fb528;

/** The content size a zstd frame declares, or -1 when it declares none (python-zstandard's
 * ``frame_content_size``); a ShardCorruptError naming ``what`` when ``data`` is no zstd frame. */
export function frameContentSize(data, what) {
  if (data.length < 4) throw new ShardCorruptError(`${what}: not a zstd frame (too short)`);
  const dv = new DataView(data.buffer, data.byteOffset, data.length);
  const magic = dv.getUint32(0, true);
  if ((magic & 0xfffffff0) >>> 0 === 0x184d2a50) return 0; // a skippable frame holds no content
  if (magic !== MAGIC) throw new ShardCorruptError(`${what}: not a zstd frame (bad magic)`);
  if (data.length < 5) throw new ShardCorruptError(`${what}: not a zstd frame (header cut off)`);
  const fhd = data[4];
  const fcsFlag = fhd >> 6;
  const single = (fhd >> 5) & 1;
  if (fhd & 0x08) throw new ShardCorruptError(`${what}: not a zstd frame (reserved bit set)`);
  const dictBytes = [0, 1, 2, 4][fhd & 3];
  const fcsBytes = fcsFlag === 0 ? single : [0, 2, 4, 8][fcsFlag];
  const pos = 5 + (single ? 0 : 1) + dictBytes;
  if (data.length < pos + fcsBytes) throw new ShardCorruptError(`${what}: not a zstd frame (header cut off)`);
  if (fcsBytes === 0) return -1;
  if (fcsBytes === 1) return data[pos];
  if (fcsBytes === 2) return dv.getUint16(pos, true) + 256;
  if (fcsBytes === 4) return dv.getUint32(pos, true);
  return dv.getUint32(pos, true) + dv.getUint32(pos + 4, true) * 2 ** 32;
}

/** Decompress one zstd frame whose content must be exactly ``expected`` bytes (checked first). */
export function zstdExact(section, expected, what) {
  const size = frameContentSize(section, what);
  if (size !== expected) {
    throw new ShardCorruptError(`${what}: zstd frame declares ${size} bytes, expected ${expected}`);
  }
  let out;
  try {
    out = decompress(section); // (no output buffer: fzstd 0.1.1 compares it with == 1, stringifying it)
  } catch (e) {
    throw new ShardCorruptError(`${what}: zstd frame does not decode (${e.message})`);
  }
  if (out.length !== expected) {
    throw new ShardCorruptError(`${what}: decoded ${out.length} bytes, expected ${expected}`);
  }
  return out;
}
