// IEEE 754 binary16 <-> JavaScript numbers, round to nearest even (what numpy's and torch's float16 casts do).

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** The number a float16 bit pattern holds. */
export function f16ToNumber(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1024 + frac) * 2 ** (exp - 25);
}

/** The float16 bit pattern nearest to a float32 value ``x`` (ties to even; overflow to infinity). */
export function f32ToF16(x) {
  F32[0] = x;
  const b = U32[0];
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15; // the float16 exponent field
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign; // below half the smallest subnormal
    mant |= 0x800000; // the implicit bit
    const shift = 14 - e; // 13 + (1 - e)
    const half = 1 << (shift - 1);
    let r = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    if (rest > half || (rest === half && r & 1)) r += 1;
    return sign | r; // a carry into the exponent field is the right answer
  }
  let r = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && r & 1)) r += 1; // a carry may reach infinity: also right
  return sign | r;
}

/** A float16 bit pattern is finite. */
export function f16Finite(h) {
  return (h & 0x7c00) !== 0x7c00;
}

/** float16 bits -> float32 table (65536 entries, built once). */
let TABLE = null;
export function f16Table() {
  if (TABLE === null) {
    TABLE = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) TABLE[h] = f16ToNumber(h);
  }
  return TABLE;
}
