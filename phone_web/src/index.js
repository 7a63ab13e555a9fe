// The phone page's decoding modules (docs/format.md; the Python reference is sakura_core/kv/).
export * from "./errors.js";
export { default as FORMAT_CONSTANTS } from "./format_constants.js";
export { parseShard, crc32 } from "./container.js";
export { sha256Hex, checkBlob } from "./digest.js";
export { CODECS, parseChain, decodeChain, applyReference, reuseReference } from "./chain.js";
export { f16ToNumber, f32ToF16 } from "./f16.js";
export { boundedJson, jsonDepth } from "./bounded_json.js";
export { parseManifest, parseManifestBytes } from "./manifest.js";
export { ChainDecoder } from "./chain.js";
export { levelName, slotFromManifest, checkShardGeometry, checkShardBinding, decodeForSlot } from "./binding.js";
export { fetchShard } from "./fetch_shard.js";
export { decodeTemplate, templatePlan } from "./template.js";
