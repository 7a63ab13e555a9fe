// Python's float rules the policy port needs to give Python's decisions and words: builtin max/min (the first
// argument wins ties and NaN comparisons), format(x, ".Nf") (exact round-half-even of the binary value, which
// Number.prototype.toFixed is not on exact ties), and numpy's argmin (the first minimum; the first NaN wins).

/** Python's max(a, b): b only when b > a. */
export function pyMax(a, b) {
  return b > a ? b : a;
}

/** Python's min(a, b): b only when b < a. */
export function pyMin(a, b) {
  return b < a ? b : a;
}

/** numpy's argmin of an array of numbers (first NaN, else the first minimum). */
export function argmin(xs) {
  let best = 0;
  for (let i = 0; i < xs.length; i++) {
    if (Number.isNaN(xs[i])) return i;
    if (xs[i] < xs[best]) best = i;
  }
  return best;
}

const _view = new DataView(new ArrayBuffer(8));

/** ``f"{x:.{digits}f}"`` as Python writes it: the exact binary value rounded half to even. */
export function fixed(x, digits) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  _view.setFloat64(0, x);
  const hi = _view.getUint32(0);
  const lo = _view.getUint32(4);
  const negative = hi >>> 31 === 1;
  const biased = (hi >>> 20) & 0x7ff;
  let mant = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let exp = biased - 1075;
  if (biased === 0) exp = -1074;
  else mant |= 1n << 52n;
  // |x| = mant * 2^exp; n = round_half_even(|x| * 10^digits)
  let num = mant * 10n ** BigInt(digits);
  let n;
  if (exp >= 0) {
    n = num << BigInt(exp);
  } else {
    const den = 1n << BigInt(-exp);
    n = num / den;
    const rem2 = 2n * (num - n * den);
    if (rem2 > den || (rem2 === den && n % 2n === 1n)) n += 1n;
  }
  let s = n.toString();
  if (digits > 0) {
    s = s.padStart(digits + 1, "0");
    s = `${s.slice(0, s.length - digits)}.${s.slice(s.length - digits)}`;
  }
  return negative ? `-${s}` : s;
}
