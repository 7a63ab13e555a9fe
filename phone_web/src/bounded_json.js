// The one JSON loader for bytes from the network (sakura_core/limits.bounded_json): at most MAX_JSON_BYTES and
// MAX_JSON_DEPTH (checked before parsing), UTF-8, no NaN / Infinity. Unlike JSON.parse it keeps what Python's json
// keeps: a number written with a fraction or an exponent is a float (a Number object here: `2.0` is no int, as in
// Python), an integer a plain number; objects have no prototype (a "__proto__" key is an ordinary key).
import C from "./format_constants.js";
import { JSONValueError, LimitError } from "./errors.js";

const UTF8 = new TextDecoder("utf-8", { fatal: true });
const WS = /[ \t\n\r]*/y;
const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const STRING = /"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/y;

/** The deepest nesting of arrays and objects in JSON bytes, strings skipped (limits.json_depth). */
export function jsonDepth(bytes) {
  let depth = 0;
  let max = 0;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (b === 0x22) {
      // a string: skip to its closing quote (an unterminated one ends the text, as Python's regex leaves it)
      let j = i + 1;
      while (j < bytes.length && bytes[j] !== 0x22) j += bytes[j] === 0x5c ? 2 : 1;
      if (j >= bytes.length) continue; // no closing quote: the quote itself is skipped, as the regex does
      i = j;
    } else if (b === 0x5b || b === 0x7b) max = Math.max(max, ++depth);
    else if (b === 0x5d || b === 0x7d) depth--;
  }
  return max;
}

/** Parse ``bytes`` (Uint8Array) as JSON within the bounds; LimitError past one, JSONValueError for what is not JSON. */
export function boundedJson(bytes, what, { maxBytes = C.limits.MAX_JSON_BYTES, maxDepth = C.limits.MAX_JSON_DEPTH } = {}) {
  if (bytes.length > maxBytes) {
    throw new LimitError(`${what}: JSON of ${bytes.length} bytes: its size is ${bytes.length}, over the limit of ${maxBytes}`);
  }
  const depth = jsonDepth(bytes);
  if (depth > maxDepth) throw new LimitError(`${what}: JSON nested ${depth} deep, over the limit of ${maxDepth}`);
  let text;
  try {
    // Python's json.loads(bytes) decodes UTF-8 with or without a byte order mark (TextDecoder drops one)
    text = UTF8.decode(bytes);
  } catch {
    throw new JSONValueError(`${what}: invalid JSON: not UTF-8`);
  }
  const p = { text, pos: 0, what };
  const value = parseValue(p);
  skip(p, WS);
  if (p.pos !== text.length) fail(p, "extra data");
  return value;
}

function fail(p, why) {
  throw new JSONValueError(`${p.what}: invalid JSON: ${why} at character ${p.pos}`);
}

function skip(p, re) {
  re.lastIndex = p.pos;
  const m = re.exec(p.text);
  if (m) p.pos += m[0].length;
  return m;
}

function parseValue(p) {
  skip(p, WS);
  const c = p.text[p.pos];
  if (c === "{") return parseObject(p);
  if (c === "[") return parseArray(p);
  if (c === '"') return parseString(p);
  for (const [word, value] of [["true", true], ["false", false], ["null", null]]) {
    if (p.text.startsWith(word, p.pos)) {
      p.pos += word.length;
      return value;
    }
  }
  const m = skip(p, NUMBER);
  if (!m || m[0] === "" || m[0] === "-") fail(p, "expecting a value");
  // eslint-disable-next-line no-new-wrappers
  return m[1] !== undefined || m[2] !== undefined ? new Number(Number(m[0])) : Number(m[0]);
}

function parseString(p) {
  const m = skip(p, STRING);
  if (!m) fail(p, "invalid string");
  return JSON.parse(m[0]);
}

function parseArray(p) {
  const out = [];
  p.pos += 1;
  skip(p, WS);
  if (p.text[p.pos] === "]") {
    p.pos += 1;
    return out;
  }
  for (;;) {
    out.push(parseValue(p));
    skip(p, WS);
    const c = p.text[p.pos++];
    if (c === "]") return out;
    if (c !== ",") fail(p, "expecting ',' or ']'");
  }
}

function parseObject(p) {
  const out = Object.create(null);
  p.pos += 1;
  skip(p, WS);
  if (p.text[p.pos] === "}") {
    p.pos += 1;
    return out;
  }
  for (;;) {
    skip(p, WS);
    if (p.text[p.pos] !== '"') fail(p, "expecting a property name");
    const key = parseString(p);
    skip(p, WS);
    if (p.text[p.pos++] !== ":") fail(p, "expecting ':'");
    out[key] = parseValue(p);
    skip(p, WS);
    const c = p.text[p.pos++];
    if (c === "}") return out;
    if (c !== ",") fail(p, "expecting ',' or '}'");
  }
}
