// CacheGen (sakura_core/kv/cachegen.py; docs/format.md section 5): per-token max-abs quantisation, per (layer,
// channel) 16-bit CDF tables, one range-coded stream per (tensor, layer, block, channel). The entropy stage is
// written here from what constriction 0.5 (the Python side's coder) specifies: a categorical model quantised "fast"
// to 24-bit fixed point (left cumulative of symbol i = trunc(sum of the probabilities before it x s) + i, with
// s = (2^24 - n) / their total computed first, in float64), and its queue range decoder (32-bit words, a 64-bit state, precision 24). The values are
// computed in float64, as numpy promotes them, and rounded straight to float16.
import C from "./format_constants.js";
import { ShardCorruptError } from "./errors.js";
import { f16Finite, f16Table } from "./f16.js";

const { CHUNK_TOKENS, BLOCK_TOKENS } = C.cachegen;
const ALLOWED_BINS = new Set(C.cachegen.ALLOWED_BINS);
const MAX_BINS = Math.max(...C.cachegen.ALLOWED_BINS);
const TOTAL = 65535; // the tables' 16-bit scale
const PRECISION = 24n;
const MASK64 = (1n << 64n) - 1n;

/** The float16 bit pattern nearest to a float64 ``x`` (ties to even, one rounding). */
export function f64ToF16(x) {
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  if (Number.isNaN(a)) return 0x7e00;
  if (a >= 65520) return sign | 0x7c00;
  const even = (v) => {
    const f = Math.floor(v);
    const d = v - f;
    return d > 0.5 || (d === 0.5 && f % 2 === 1) ? f + 1 : f;
  };
  if (a < 2 ** -14) return sign | even(a * 2 ** 24); // subnormal (1024: the smallest normal, also right)
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e -= 1;
  if (2 ** (e + 1) <= a) e += 1;
  return sign | (((e + 15) << 10) + even(a / 2 ** (e - 10)) - 1024);
}

/** constriction's "fast" 24-bit quantisation of a 16-bit CDF row: the extended fixed-point CDF (n + 1 entries). */
function quantizedCdf(row) {
  const n = row.length - 1;
  const probs = new Float64Array(n);
  let total = 0;
  for (let i = 0; i < n; i++) {
    probs[i] = (row[i + 1] - row[i]) / TOTAL;
    total += probs[i];
  }
  const scale = (2 ** 24 - n) / total;
  const cdf = new Uint32Array(n + 1);
  let cumulative = 0;
  for (let i = 0; i < n; i++) {
    cdf[i] = Math.trunc(cumulative * scale) + i;
    cumulative += probs[i];
  }
  cdf[n] = 2 ** 24;
  return cdf;
}

/** ``amt`` symbols of one model from one stream (Uint32Array words), as constriction's RangeDecoder reads them. */
function decodeStream(words, cdf, amt, out, offset, stride) {
  let pos = 0;
  let point = 0n;
  for (let i = 0; i < 2; i++) point = (point << 32n) | BigInt(pos < words.length ? words[pos++] : 0);
  // fewer than two words: the read ones are left-aligned (the missing low bits are zero) — the same value here
  let lower = 0n;
  let range = MASK64;
  const n = cdf.length - 1;
  for (let s = 0; s < amt; s++) {
    const scale = range >> PRECISION;
    const quantile = ((point - lower) & MASK64) / scale;
    if (quantile >= 1n << PRECISION) throw new ShardCorruptError("cachegen: a stream does not decode (invalid data)");
    const q = Number(quantile);
    let lo = 0;
    let hi = n; // the symbol: the last i < n with cdf[i] <= q
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] <= q) lo = mid;
      else hi = mid;
    }
    out[offset + s * stride] = lo;
    lower = (lower + scale * BigInt(cdf[lo])) & MASK64;
    range = scale * BigInt(cdf[lo + 1] - cdf[lo]);
    if (range < 1n << 32n) {
      lower = (lower << 32n) & MASK64;
      range <<= 32n;
      point = ((point << 32n) & MASK64) | BigInt(pos < words.length ? words[pos++] : 0);
    }
  }
}

function blockRanges(t) {
  const out = [];
  for (let c0 = 0, ci = 0; c0 < t; c0 += CHUNK_TOKENS, ci++) {
    for (let b0 = c0; b0 < Math.min(c0 + CHUNK_TOKENS, t); b0 += BLOCK_TOKENS) {
      out.push([ci, b0, Math.min(b0 + BLOCK_TOKENS, c0 + CHUNK_TOKENS, t)]);
    }
  }
  return out;
}

function expectLen(section, n, what) {
  if (section.length !== n) throw new ShardCorruptError(`${what}: section has ${section.length} bytes, expected ${n}`);
}

const u16 = (s) => {
  const out = new Uint16Array(s.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = s[2 * i] | (s[2 * i + 1] << 8);
  return out;
};

export function decodeCachegen(parsed) {
  if (parsed.length !== 1 || parsed[0].header.parent !== null) {
    throw new ShardCorruptError("cachegen is not progressive: decode takes exactly one base blob");
  }
  const { header, sections } = parsed[0];
  if (sections.length !== 6) throw new ShardCorruptError(`cachegen blob has ${sections.length} sections, expected 6`);
  const [nL, t, h, d] = header.shape;
  const nCh = h * d;
  const nChunks = Math.ceil(t / CHUNK_TOKENS);
  const blocks = blockRanges(t);
  expectLen(sections[0], 2 * nL + 2, "cachegen bins");
  const bins = [Array.from(sections[0].subarray(0, nL)), Array.from(sections[0].subarray(nL, 2 * nL))];
  const alphabets = [sections[0][2 * nL], sections[0][2 * nL + 1]];
  if (!bins.flat().every((b) => ALLOWED_BINS.has(b)) || alphabets.some((a, ti) => a < Math.max(...bins[ti]))) {
    throw new ShardCorruptError("cachegen: bin counts are not valid");
  }
  if (alphabets.some((a) => a > MAX_BINS)) throw new ShardCorruptError("cachegen: table width is not valid");
  expectLen(sections[1], 2 * nL * t * 2, "cachegen max tensors");
  const maxBits = u16(sections[1]);
  const tab16 = f16Table();
  if (!maxBits.every((m) => f16Finite(m) && tab16[m] >= 0)) throw new ShardCorruptError("cachegen: max tensors are not finite and >= 0");
  const tables = [0, 1].map((ti) => {
    const width = alphabets[ti] + 1;
    expectLen(sections[2 + ti], nChunks * nL * nCh * width * 2, "cachegen tables");
    const tab = u16(sections[2 + ti]);
    for (let r = 0; r < tab.length / width; r++) {
      const row = tab.subarray(r * width, (r + 1) * width);
      if (row[0] !== 0 || row[width - 1] !== TOTAL || row.some((x, i) => i && x <= row[i - 1])) {
        throw new ShardCorruptError("cachegen: probability table is not a strictly increasing 16-bit CDF");
      }
    }
    return tab;
  });
  const nStreams = 2 * nL * blocks.length * nCh;
  expectLen(sections[4], 4 * nStreams, "cachegen stream lengths");
  const lengths = new DataView(sections[4].buffer, sections[4].byteOffset, sections[4].length);
  let sum = 0;
  for (let s = 0; s < nStreams; s++) {
    const n = lengths.getUint32(4 * s, true);
    if (n % 4) sum = -1;
    if (sum >= 0) sum += n;
  }
  if (sum !== sections[5].length) throw new ShardCorruptError("cachegen: stream lengths do not add up to the bytestream");
  const words = new Uint32Array(sections[5].length / 4);
  const wv = new DataView(sections[5].buffer, sections[5].byteOffset, sections[5].length);
  for (let i = 0; i < words.length; i++) words[i] = wv.getUint32(4 * i, true);
  const out = [];
  let s = 0;
  let w = 0;
  for (let ti = 0; ti < 2; ti++) {
    const width = alphabets[ti] + 1;
    const sym = new Int32Array(nL * t * nCh); // (layers, tokens, channels)
    for (let li = 0; li < nL; li++) {
      for (const [ci, b0, b1] of blocks) {
        for (let ch = 0; ch < nCh; ch++) {
          const row = ((ci * nL + li) * nCh + ch) * width;
          const n = lengths.getUint32(4 * s, true) / 4;
          decodeStream(words.subarray(w, w + n), quantizedCdf(tables[ti].subarray(row, row + width)), b1 - b0, sym,
            (li * t + b0) * nCh + ch, nCh);
          w += n;
          s += 1;
        }
      }
    }
    const x = new Uint16Array(nL * t * nCh);
    for (let li = 0; li < nL; li++) {
      const c = (bins[ti][li] >> 1) - 1;
      for (let tok = 0; tok < t; tok++) {
        const max = tab16[maxBits[(ti * nL + li) * t + tok]];
        for (let ch = 0; ch < nCh; ch++) {
          const i = (li * t + tok) * nCh + ch;
          if (sym[i] > 2 * c) throw new ShardCorruptError("cachegen: decoded symbol outside the layer's bins");
          x[i] = f64ToF16(((sym[i] - c) / c) * max);
        }
      }
    }
    out.push(x);
  }
  return { k: out[0], v: out[1] };
}
