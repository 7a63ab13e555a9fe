// The shard container (docs/format.md section 4; sakura_core/kv/container.py and header_checks.py): parseShard
// checks, in Python's order, the size, magic and version, the declared lengths against the blob, the CRC, then
// every field, and raises the same error class Python raises.
import C from "./format_constants.js";
import {
  ShardCorruptError,
  ShardMagicError,
  ShardOversizedError,
  ShardTruncatedError,
  ShardVersionError,
} from "./errors.js";

const K = C.container;
const FIXED = K.FIXED_HEADER_BYTES; // 97
const TRAILER = 4;
const FLAG_REFINES = 0x01;
const FLAG_REFERENCE = 0x02;
const FLAG_SCALE = 0x04;
const NO_STEP = 0xffff;
const DTYPES = Object.fromEntries(Object.entries(K.DTYPE_CODES).map(([name, code]) => [code, name]));
// Python's re.match with "^...$" also takes one trailing newline; the JS forms say so explicitly
const CODEC_RE = /^[a-z0-9][a-z0-9_-]{0,31}\n?$/;
const ROPE_RE = /^[A-Za-z0-9._-]{1,64}\n?$/;
const MODEL_ID_RE = /^[0-9a-f]{1,128}$/;
const TEMPLATE_ID_RE = /^[a-z0-9-]{1,64}$/;

let CRC_TABLE = null;
/** CRC-32 (zlib's polynomial) of ``bytes``. */
export function crc32(bytes) {
  if (CRC_TABLE === null) {
    CRC_TABLE = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      CRC_TABLE[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
const isZero = (b) => b.every((x) => x === 0);
const UTF8 = new TextDecoder("utf-8", { fatal: true });

/** Bytes of a shard's predictor scale codes: one int8 per (K or V, layer, head, channel). */
export function scaleCodesSize(layers, heads, headDim) {
  return 2 * layers * heads * headDim;
}

/** Split a blob (Uint8Array) into its validated header and its payload sections (views into the blob). */
export function parseShard(blob) {
  const n = blob.length;
  if (n > K.MAX_BLOB_BYTES) throw new ShardOversizedError(`shard blob of ${n} bytes exceeds the limit`);
  if (n < 4) throw new ShardTruncatedError(`shard blob of ${n} bytes is shorter than the magic`);
  const magic = String.fromCharCode(...blob.subarray(0, 4));
  if (magic !== K.MAGIC) throw new ShardMagicError(`not a SAKURA shard: starts with ${JSON.stringify(magic)}`);
  if (n < 6) throw new ShardTruncatedError(`shard blob of ${n} bytes ends inside the header`);
  const dv = new DataView(blob.buffer, blob.byteOffset, n);
  const version = dv.getUint16(4, true);
  if (version !== K.FORMAT_VERSION) {
    throw new ShardVersionError(
      `shard format version ${version} is not supported (this client reads version ${K.FORMAT_VERSION}); ` +
        (version < K.FORMAT_VERSION ? "re-encode the template" : "upgrade the client"),
    );
  }
  if (n < FIXED + TRAILER) throw new ShardTruncatedError(`shard blob of ${n} bytes is shorter than the fixed header`);
  const f = {
    headerSize: dv.getUint16(6, true),
    flags: blob[8],
    dtypeCode: blob[9],
    level: dv.getUint16(10, true),
    layerFirst: dv.getUint16(12, true),
    layerLast: dv.getUint16(14, true),
    rows: dv.getUint16(16, true),
    cols: dv.getUint16(18, true),
    heads: dv.getUint16(20, true),
    headDim: dv.getUint16(22, true),
    parentRaw: blob.subarray(24, 56),
    step: dv.getUint16(56, true),
    refStep: dv.getUint16(58, true),
    refRaw: blob.subarray(60, 92),
    nSections: blob[92],
    lens: [blob[93], blob[94], blob[95], blob[96]],
  };
  const lengths = sectionLengths(blob, dv, f);
  const header = readHeader(blob, f);
  const sections = [];
  let pos = f.headerSize;
  for (const size of lengths) {
    sections.push(blob.subarray(pos, pos + size));
    pos += size;
  }
  return { header, sections };
}

function sectionLengths(blob, dv, f) {
  const n = blob.length;
  if (f.nSections > K.MAX_SECTIONS) {
    throw new ShardCorruptError(`shard declares ${f.nSections} sections, at most ${K.MAX_SECTIONS} are allowed`);
  }
  const scale = f.flags & FLAG_SCALE ? scaleCodesSize(f.layerLast - f.layerFirst + 1, f.heads, f.headDim) : 0;
  const strings = f.lens.reduce((a, b) => a + b, 0);
  const expected = FIXED + strings + scale + 4 * f.nSections;
  if (f.headerSize !== expected) {
    throw new ShardCorruptError(`shard header size field ${f.headerSize} != ${expected} computed from its fields`);
  }
  if (n < f.headerSize + TRAILER) throw new ShardTruncatedError(`shard blob of ${n} bytes ends inside its header`);
  const lengths = [];
  let total = f.headerSize + TRAILER;
  for (let i = 0; i < f.nSections; i++) {
    const size = dv.getUint32(f.headerSize - 4 * f.nSections + 4 * i, true);
    lengths.push(size);
    total += size;
  }
  if (total > K.MAX_BLOB_BYTES) throw new ShardOversizedError(`shard declares ${total} bytes, over the limit`);
  if (n < total) throw new ShardTruncatedError(`shard blob has ${n} bytes but its header declares ${total}`);
  if (n > total) throw new ShardCorruptError(`shard blob has ${n - total} trailing bytes after the declared ${total}`);
  if (crc32(blob.subarray(0, n - TRAILER)) !== dv.getUint32(n - TRAILER, true)) {
    throw new ShardCorruptError("shard checksum mismatch: the blob was corrupted in storage or transfer");
  }
  return lengths;
}

function readHeader(blob, f) {
  if (f.flags & ~(FLAG_REFINES | FLAG_REFERENCE | FLAG_SCALE)) throw new ShardCorruptError("shard has unknown flag bits");
  if (!(f.dtypeCode in DTYPES)) throw new ShardCorruptError(`shard has unknown dtype code ${f.dtypeCode}`);
  const refines = Boolean(f.flags & FLAG_REFINES);
  if (refines === isZero(f.parentRaw)) throw new ShardCorruptError("shard refinement flag and parent digest disagree");
  const hasRef = Boolean(f.flags & FLAG_REFERENCE);
  if (hasRef === isZero(f.refRaw) || hasRef === (f.refStep === NO_STEP)) {
    throw new ShardCorruptError("shard reference flag, reference step and reference digest disagree");
  }
  let pos = FIXED;
  const strings = [];
  for (const size of f.lens) {
    try {
      strings.push(UTF8.decode(blob.subarray(pos, pos + size)));
    } catch {
      throw new ShardCorruptError(`shard header string at byte ${pos} is not utf-8`);
    }
    pos += size;
  }
  const header = {
    codec: strings[0],
    level: f.level,
    modelId: strings[1],
    templateId: strings[2],
    ropeLayout: strings[3],
    layerFirst: f.layerFirst,
    layerLast: f.layerLast,
    tokenGrid: [f.rows, f.cols],
    heads: f.heads,
    headDim: f.headDim,
    dtype: DTYPES[f.dtypeCode],
    parent: refines ? hex(f.parentRaw) : null,
    step: f.step === NO_STEP ? null : f.step,
    refStep: hasRef ? f.refStep : null,
    refDigest: hasRef ? hex(f.refRaw) : null,
    refScale: f.flags & FLAG_SCALE ? blob.slice(pos, f.headerSize - 4 * f.nSections) : null,
  };
  const problem = headerProblem(header);
  if (problem) throw new ShardCorruptError(`shard header field out of range: ${problem}`);
  header.numLayers = header.layerLast - header.layerFirst + 1;
  header.numTokens = f.rows * f.cols;
  header.shape = [header.numLayers, header.numTokens, header.heads, header.headDim];
  header.numElements = header.shape.reduce((a, b) => a * b, 1);
  if (header.numElements > K.MAX_ELEMENTS) {
    throw new ShardOversizedError(`shard describes ${header.numElements} elements per tensor, over the limit`);
  }
  return header;
}

/** What is wrong with a header's fields (sakura_core/kv/header_checks.header_problems), or "" when nothing. */
function headerProblem(h) {
  if (!CODEC_RE.test(h.codec)) return `codec ${JSON.stringify(h.codec)}`;
  if (!MODEL_ID_RE.test(h.modelId)) return `model_id ${JSON.stringify(h.modelId)}`;
  if (!TEMPLATE_ID_RE.test(h.templateId)) return `template_id ${JSON.stringify(h.templateId)}`;
  if (!ROPE_RE.test(h.ropeLayout)) return `rope_layout ${JSON.stringify(h.ropeLayout)}`;
  if (!(h.layerFirst <= h.layerLast && h.layerLast <= K.MAX_LAYER)) return `layer range ${h.layerFirst}-${h.layerLast}`;
  const [rows, cols] = h.tokenGrid;
  if (!(rows >= 1 && rows <= K.MAX_GRID_SIDE && cols >= 1 && cols <= K.MAX_GRID_SIDE)) return `token_grid ${rows}x${cols}`;
  if (!(h.heads >= 1 && h.heads <= K.MAX_HEADS)) return `heads ${h.heads}`;
  if (!(h.headDim >= 1 && h.headDim <= K.MAX_HEAD_DIM)) return `head_dim ${h.headDim}`;
  if (h.refScale !== null && h.refStep === null) return "ref_scale without a reference";
  if (h.refStep !== null && (h.step === null || !(h.refStep < h.step))) {
    return `ref_step ${h.refStep} must be an earlier step than the shard's step ${h.step}`;
  }
  return "";
}

/** Same KV slice (model, template, layers, geometry, dtype, step, reference): ShardHeader.same_shard. */
export function sameShard(a, b) {
  return (
    a.modelId === b.modelId &&
    a.templateId === b.templateId &&
    a.ropeLayout === b.ropeLayout &&
    a.layerFirst === b.layerFirst &&
    a.layerLast === b.layerLast &&
    a.tokenGrid[0] === b.tokenGrid[0] &&
    a.tokenGrid[1] === b.tokenGrid[1] &&
    a.heads === b.heads &&
    a.headDim === b.headDim &&
    a.dtype === b.dtype &&
    a.step === b.step &&
    a.refStep === b.refStep &&
    a.refDigest === b.refDigest
  );
}
