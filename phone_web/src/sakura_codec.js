// The SAKURA codec's decoder (docs/format.md section 5; sakura_core/kv/sakura_decode.py, sakura_dequant.py):
// progressive chains applied blob by blob, every float operation one float32 rounding (Math.fround), float16 by
// round to nearest even, so the output is Python's bit for bit.
import C from "./format_constants.js";
import { ShardCorruptError } from "./errors.js";
import { f16Finite, f16Table, f32ToF16 } from "./f16.js";
import { zstdExact } from "./zstd.js";

const W = C.sakura.WIDTHS; // (0, 1, 2, 3, 4, 5, 6, 8)
const SPAN = new Float32Array(new Uint32Array(C.sakura.SPAN_F32_BITS).buffer);
const fr = Math.fround;

const perByte = (m) => ({ 1: 8, 2: 4, 4: 2 })[m] ?? 1;

/** Bytes of a base blob's per-channel ranges and means (compact: a predicted residual's). */
function metaSize(nL, h, d, compact) {
  return (compact ? 4 : 6) * 2 * nL * h * d;
}

/** m-bit symbols from their packing (sakura_decode._unpack_symbols). */
function unpackSymbols(raw, m, nSym) {
  const out = new Uint8Array(nSym);
  const per = perByte(m);
  if (m === 1) {
    for (let i = 0; i < nSym; i++) out[i] = (raw[i >> 3] >> (7 - (i & 7))) & 1;
    return out;
  }
  if (per === 1) {
    for (let i = 0; i < nSym; i++) {
      if (raw[i] >= 1 << m) throw new ShardCorruptError(`sakura: ${m}-bit symbol out of range`);
      out[i] = raw[i];
    }
    return out;
  }
  const q = raw.length;
  const mask = (1 << m) - 1;
  for (let p = 0; p < per; p++) {
    const shift = m * (per - 1 - p);
    for (let j = 0; j < q && p * q + j < nSym; j++) out[p * q + j] = (raw[j] >> shift) & mask;
  }
  return out;
}

/** The per-channel ranges and means at the start of a base blob's head (float32 lo and step, float16 means). */
function baseParams(head, nL, h, d, compact) {
  const n = 2 * nL * h * d;
  const tab = f16Table();
  const word = (i) => head[2 * i] | (head[2 * i + 1] << 8);
  const lo = new Float32Array(n);
  const hi = new Float32Array(n);
  const mean = new Uint16Array(n);
  let bad = false;
  for (let i = 0; i < n; i++) {
    if (compact) {
      mean[i] = word(i);
      const mu = tab[mean[i]];
      lo[i] = fr(mu - SPAN[head[2 * n + i]]);
      hi[i] = fr(mu + SPAN[head[3 * n + i]]);
    } else {
      lo[i] = tab[word(i)];
      hi[i] = tab[word(n + i)];
      mean[i] = word(2 * n + i);
    }
    if (!Number.isFinite(lo[i]) || !Number.isFinite(hi[i]) || !f16Finite(mean[i]) || hi[i] < lo[i]) bad = true;
  }
  if (bad) throw new ShardCorruptError("sakura: channel ranges / means are not finite or inverted");
  const step = new Float32Array(n);
  for (let i = 0; i < n; i++) step[i] = fr(fr(hi[i] - lo[i]) / 255);
  return { lo, step, mean };
}

/** Apply one blob of a chain to ``state`` (null before the base); returns the new state, ``state`` untouched. */
export function sakuraStep(state, header, sections) {
  const [nL, t, h, d] = header.shape;
  const nUnits = 2 * nL * t * h;
  const base = state === null;
  if (base !== (header.parent === null)) {
    throw new ShardCorruptError("sakura: the first blob of a chain must be a base and the others refinements");
  }
  if (sections.length === 0) throw new ShardCorruptError("sakura: blob has no sections");
  const compact = header.refScale !== null;
  const metaBytes = base ? metaSize(nL, h, d, compact) : 0;
  const head = zstdExact(sections[0], metaBytes + nUnits, "sakura head");
  const params = base ? baseParams(head, nL, h, d, compact) : state.params;
  const prev = base ? new Uint8Array(nUnits) : state.idx;
  const acc = base ? new Uint8Array(nUnits * d) : state.acc.slice();
  const delta = head.subarray(metaBytes, metaBytes + nUnits);
  for (let u = 0; u < nUnits; u++) {
    if (delta[u] >= W.length) throw new ShardCorruptError("sakura: width delta out of range");
  }
  const idx = new Uint8Array(nUnits);
  const added = new Uint8Array(nUnits);
  const present = new Array(9).fill(false);
  for (let u = 0; u < nUnits; u++) {
    idx[u] = prev[u] + delta[u];
    if (idx[u] >= W.length) throw new ShardCorruptError("sakura: width index out of range");
    added[u] = W[idx[u]] - W[prev[u]];
    present[added[u]] = true;
  }
  const groups = [];
  for (let m = 1; m <= 8; m++) if (present[m]) groups.push(m);
  if (sections.length !== 1 + groups.length) {
    throw new ShardCorruptError(`sakura: blob has ${sections.length} sections, its widths need ${1 + groups.length}`);
  }
  const units = new Int32Array(nUnits);
  groups.forEach((m, g) => {
    let n = 0;
    for (let u = 0; u < nUnits; u++) if (added[u] === m) units[n++] = u;
    const nSym = n * d;
    const raw = zstdExact(sections[1 + g], Math.ceil(nSym / perByte(m)), `sakura ${m}-bit group`);
    const sym = unpackSymbols(raw, m, nSym);
    for (let r = 0; r < n; r++) {
      const a = units[r] * d;
      const b = r * d;
      for (let c = 0; c < d; c++) acc[a + c] = ((acc[a + c] << m) | sym[b + c]) & 0xff;
    }
  });
  return { idx, acc, params };
}

/** float16 K and V of a decoded state: the centre of each unit's bin, the channel mean for a dropped unit. */
export function sakuraFinish(state, header) {
  const [nL, t, h, d] = header.shape;
  const half = nL * t * h * d;
  const out = new Uint16Array(2 * half);
  const { idx, acc, params } = state;
  const { mean, step, lo } = params;
  for (let u = 0; u < idx.length; u++) {
    const w = W[idx[u]];
    const p0 = (Math.floor(u / (t * h)) * h + (u % h)) * d; // (tensor * layers + layer, head) channels
    const i0 = u * d;
    if (w === 0) {
      out.set(mean.subarray(p0, p0 + d), i0);
      continue;
    }
    // the bin centre in fine-code units: acc itself at full width, else (acc << (8 - w) | 1 << (7 - w)) - 0.5
    const shift = 8 - w;
    const bias = w === 8 ? 0 : 1 << (7 - w);
    const minus = w === 8 ? 0 : 0.5;
    for (let c = 0; c < d; c++) {
      const code = ((acc[i0 + c] << shift) | bias) - minus;
      out[i0 + c] = f32ToF16(fr(fr(code * step[p0 + c]) + lo[p0 + c]));
    }
  }
  return { k: out.subarray(0, half), v: out.subarray(half) };
}

/** Decode a validated chain base..level. */
export function decodeSakura(parsed) {
  let state = null;
  for (const { header, sections } of parsed) state = sakuraStep(state, header, sections);
  return sakuraFinish(state, parsed[parsed.length - 1].header);
}
