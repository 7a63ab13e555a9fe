// fp16, int8 and int4 (sakura_core/kv/plain_codecs.py): one self-contained blob each; decoded K and V are float16
// bit patterns (Uint16Array, (layers, tokens, heads, head_dim)).
import { ShardCorruptError } from "./errors.js";
import { f16Finite, f16Table, f32ToF16 } from "./f16.js";

const F16_MAX = 65504;

function singleBlob(parsed, codec) {
  if (parsed.length !== 1 || parsed[0].header.parent !== null) {
    throw new ShardCorruptError(`${codec} is not progressive: decode takes exactly one base blob`);
  }
  return parsed[0];
}

function expectSections(sections, n, header) {
  if (sections.length !== n) {
    throw new ShardCorruptError(`${header.codec} level ${header.level} blob has ${sections.length} sections, expected ${n}`);
  }
}

function expectLen(section, n, what) {
  if (section.length !== n) throw new ShardCorruptError(`${what}: section has ${section.length} bytes, expected ${n}`);
}

/** Little-endian float16 words of a section (copied: a section may sit at an odd offset). */
function words16(section) {
  const out = new Uint16Array(section.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = section[2 * i] | (section[2 * i + 1] << 8);
  return out;
}

export function decodeFp16(parsed) {
  const { header, sections } = singleBlob(parsed, "fp16");
  expectSections(sections, 2, header);
  const nbytes = header.numElements * 2;
  expectLen(sections[0], nbytes, "fp16 K");
  expectLen(sections[1], nbytes, "fp16 V");
  const k = words16(sections[0]);
  const v = words16(sections[1]);
  if (!k.every(f16Finite) || !v.every(f16Finite)) throw new ShardCorruptError("fp16: non-finite values");
  return { k, v };
}

function decodeUniform(parsed, bits, name) {
  const { header, sections } = singleBlob(parsed, name);
  expectSections(sections, 4, header);
  const [nL, t, h, d] = header.shape;
  const rows = nL * t * h;
  const nParams = rows * 2 * 2;
  const nCodes = bits === 8 ? header.numElements : (header.numElements + 1) >> 1;
  const levels = bits === 4 ? 15 : 256;
  const tab = f16Table();
  const out = [];
  for (const [i, what] of [[0, "K"], [2, "V"]]) {
    expectLen(sections[i], nParams, `${name} ${what} params`);
    expectLen(sections[i + 1], nCodes, `${name} ${what} codes`);
    const params = words16(sections[i]);
    if (!params.every(f16Finite)) throw new ShardCorruptError(`${name} ${what} params: non-finite values`);
    for (let r = 0; r < rows; r++) {
      const lo = tab[params[2 * r]];
      const step = tab[params[2 * r + 1]];
      const top = Math.fround(Math.abs(lo) + Math.fround((levels - 1) * step));
      if (step < 0 || top > F16_MAX) {
        throw new ShardCorruptError(`${name} ${what} params: negative step or range beyond float16`);
      }
    }
    const raw = sections[i + 1];
    const n = header.numElements;
    const codes = bits === 8 ? raw : new Uint8Array(n);
    if (bits === 4) {
      for (let j = 0; j < n; j++) codes[j] = j & 1 ? raw[j >> 1] & 0x0f : raw[j >> 1] >> 4;
      if (codes.some((c) => c > 14)) throw new ShardCorruptError(`${name} ${what}: code out of range`);
    }
    const x = new Uint16Array(n);
    for (let j = 0; j < n; j++) {
      const r = (j / d) | 0;
      x[j] = f32ToF16(Math.fround(tab[params[2 * r]] + Math.fround(codes[j] * tab[params[2 * r + 1]])));
    }
    out.push(x);
  }
  return { k: out[0], v: out[1] };
}

export const decodeInt8 = (parsed) => decodeUniform(parsed, 8, "int8");
export const decodeInt4 = (parsed) => decodeUniform(parsed, 4, "int4");
