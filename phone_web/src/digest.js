// Content addresses: the sha256 of a blob's bytes as 64 lowercase hex characters (WebCrypto; node 20 has it too).
import { ShardIntegrityError } from "./errors.js";

/** Hex sha256 of ``bytes`` (Uint8Array). */
export async function sha256Hex(bytes) {
  let subtle = globalThis.crypto?.subtle;
  if (!subtle && typeof process !== "undefined") subtle = (await import("node:crypto")).webcrypto.subtle; // node 18
  if (!subtle) {
    throw new Error("SHA-256 needs WebCrypto: open the page from a secure context (https, or localhost via adb reverse)");
  }
  const d = new Uint8Array(await subtle.digest("SHA-256", bytes));
  return Array.from(d, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** ``bytes`` once their size equals the manifest's ``bytes`` and their sha256 the ``digest`` (the shard client's
 * check, sakura_core/fetch/client.py); else ShardIntegrityError: the bytes must be discarded. */
export async function checkBlob(bytes, digest, expectedBytes) {
  if (expectedBytes !== undefined && bytes.length !== expectedBytes) {
    throw new ShardIntegrityError(`shard ${digest}: ${bytes.length} bytes, the manifest says ${expectedBytes}`);
  }
  const got = await sha256Hex(bytes);
  if (got !== digest) throw new ShardIntegrityError(`shard ${digest}: the bytes hash to ${got}; discarded`);
  return bytes;
}
