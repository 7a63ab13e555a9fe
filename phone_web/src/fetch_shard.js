// Fetching one shard blob (docs/format.md section 3; sakura_core/fetch/client.py's ShardClient.fetch): a broken
// transfer resumes with `Range: bytes=<received>-` and `If-Range: "<digest>"` (a 200 answer restarts from byte 0), a
// size other than the manifest's or an ETag other than the digest is refused, no redirect is followed, transient
// statuses (408, 425, 429, 500, 502, 503, 504 without `Sakura-Retry: no`) and network errors are retried with
// backoff, and the bytes are returned only once their SHA-256 (WebCrypto) equals the digest (one whole refetch
// first). `fetchImpl` and `sleep` are injectable (tests; a shaped link).
import { AuthError, RedirectRefusedError, ShardIntegrityError, ShardNotFoundError, ShardUnavailableError } from "./errors.js";
import { sha256Hex } from "./digest.js";

const RETRY = new Set([408, 425, 429, 500, 502, 503, 504]);
const CONTENT_RANGE = /^bytes (\d+)-(\d+)\/(\d+)$/;
const DIGEST = /^[0-9a-f]{64}$/;

class Retry extends Error {}

/** The blob named ``digest`` from ``baseUrl`` (the server's root), ``expectedBytes`` long (the manifest's). */
export async function fetchShard(baseUrl, digest, expectedBytes, options = {}) {
  const { token = null, fetchImpl = globalThis.fetch, sleep = (s) => new Promise((r) => setTimeout(r, s * 1000)),
    maxAttempts = 6, integrityRetries = 1, backoffS = 0.25, maxBackoffS = 4, onChunk = null } = options;
  if (!DIGEST.test(digest)) throw new Error(`invalid shard digest ${JSON.stringify(digest)}`);
  const url = `${baseUrl.replace(/\/+$/, "")}/v1/shards/${digest}`;
  const p = { chunks: [], size: 0, total: null };
  let attempts = 0;
  let failures = 0;
  let integrityFailures = 0;
  for (;;) {
    attempts += 1;
    const before = p.size;
    try {
      await attempt(url, digest, expectedBytes, token, fetchImpl, p, onChunk);
    } catch (e) {
      if (!(e instanceof Retry || e instanceof TypeError)) throw e; // fetch's network errors are TypeErrors
      failures = p.size > before ? 0 : failures + 1;
      if (attempts >= maxAttempts) throw new ShardUnavailableError(`shard ${digest} unavailable after ${attempts} attempt(s): ${e.message}`);
      await sleep(Math.min(maxBackoffS, backoffS * 2 ** (Math.max(failures, 1) - 1)));
      continue;
    }
    const bytes = join(p);
    const actual = await sha256Hex(bytes);
    if (actual === digest) return bytes;
    integrityFailures += 1;
    if (integrityFailures > integrityRetries || attempts >= maxAttempts) {
      throw new ShardIntegrityError(`shard ${digest}: received ${bytes.length} bytes hashing to ${actual}; discarded`);
    }
    reset(p);
  }
}

function reset(p) {
  p.chunks = [];
  p.size = 0;
  p.total = null;
}

function join(p) {
  const out = new Uint8Array(p.size);
  let at = 0;
  for (const c of p.chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

async function attempt(url, digest, expectedBytes, token, fetchImpl, p, onChunk) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  const offset = p.size;
  if (offset) {
    headers.Range = `bytes=${offset}-`;
    headers["If-Range"] = `"${digest}"`;
  }
  const resp = await fetchImpl(url, { headers, redirect: "manual" });
  if (resp.type === "opaqueredirect" || (resp.status >= 300 && resp.status < 400)) {
    throw new RedirectRefusedError(`shard ${digest.slice(0, 12)}: ${url} answered a redirect (${resp.status || "opaque"} to ` +
      `${resp.headers.get("Location") ?? "an undisclosed location"}); SAKURA clients follow none`);
  }
  const etag = resp.headers.get("ETag");
  if ((resp.status === 200 || resp.status === 206) && etag !== null && etag.replace(/^W\//, "").replace(/^"|"$/g, "") !== digest) {
    throw new ShardIntegrityError(`shard ${digest}: server answered with ETag ${etag}, another object`);
  }
  let total = null;
  if (resp.status === 200) {
    if (offset) reset(p); // the server ignored the Range: start over
    const length = resp.headers.get("Content-Length");
    total = length === null ? null : Number(length);
  } else if (resp.status === 206) {
    const m = CONTENT_RANGE.exec((resp.headers.get("Content-Range") ?? "").trim());
    if (m === null || Number(m[1]) !== offset || Number(m[2]) !== Number(m[3]) - 1) {
      reset(p);
      throw new Retry(`206 with Content-Range ${resp.headers.get("Content-Range")}, asked for ${offset}-`);
    }
    total = Number(m[3]);
  } else if (resp.status === 416 && offset && p.total === offset) {
    return; // every byte is here already
  } else {
    const detail = (await resp.text().catch(() => "")).slice(0, 300);
    if (resp.status === 404) throw new ShardNotFoundError(`shard ${digest}: HTTP 404 ${detail}`);
    if (resp.status === 401 || resp.status === 403) throw new AuthError(`shard ${digest}: HTTP ${resp.status} ${detail} (pass the server's token)`);
    if (resp.status === 416) {
      reset(p);
      throw new Retry(`HTTP 416 at offset ${offset}`);
    }
    if (RETRY.has(resp.status) && (resp.headers.get("Sakura-Retry") ?? "").toLowerCase() !== "no") throw new Retry(`HTTP ${resp.status}`);
    throw new ShardUnavailableError(`shard ${digest}: HTTP ${resp.status} ${detail}`);
  }
  if (total !== null) {
    if (expectedBytes !== undefined && expectedBytes !== null && total !== expectedBytes) {
      throw new ShardIntegrityError(`shard ${digest}: server announces ${total} bytes, the manifest ${expectedBytes}`);
    }
    p.total = total;
  }
  const limit = p.total ?? expectedBytes ?? Infinity;
  const reader = resp.body.getReader();
  for (;;) {
    let step;
    try {
      step = await reader.read();
    } catch (e) {
      throw new Retry(`the body broke off at ${p.size} bytes (${e.message})`);
    }
    if (step.done) break;
    if (p.size + step.value.length > limit) {
      reset(p);
      throw new ShardIntegrityError(`shard ${digest}: server sent more than the ${limit} bytes announced`);
    }
    p.chunks.push(step.value);
    p.size += step.value.length;
    if (onChunk) await onChunk(step.value.length);
  }
  if (p.total !== null && p.size < p.total) throw new Retry(`body ended at ${p.size} of ${p.total} bytes`);
  if (p.total === null) p.total = p.size;
}
