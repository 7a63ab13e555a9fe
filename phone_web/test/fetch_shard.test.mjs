// fetchShard against a scripted server (an injected fetch): resume, restart, refusals, retries.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { fetchShard } from "../src/index.js";

const BLOB = Uint8Array.from({ length: 5000 }, (_, i) => (i * 7919) % 251);
const DIGEST = createHash("sha256").update(BLOB).digest("hex");
const noSleep = async () => {};

function body(bytes, breakAt = null) {
  let pulls = 0;
  return new ReadableStream({
    pull(c) {
      pulls += 1;
      if (breakAt === null) {
        c.enqueue(bytes);
        c.close();
      } else if (pulls === 1) {
        c.enqueue(bytes.slice(0, breakAt)); // delivered, then the connection breaks
      } else {
        c.error(new Error("connection reset"));
      }
    },
  });
}

/** A fetch answering from ``script`` (one function per request, given the request's headers). */
function scripted(script) {
  const seen = [];
  const impl = async (url, init) => {
    seen.push({ url, headers: { ...init.headers }, redirect: init.redirect });
    const step = script[Math.min(seen.length - 1, script.length - 1)];
    return step(init.headers);
  };
  return { impl, seen };
}

const ok = (h = {}) => new Response(body(BLOB), { status: 200, headers: { "Content-Length": "5000", ETag: `"${DIGEST}"`, ...h } });
const partial = (from) => new Response(body(BLOB.slice(from)), {
  status: 206, headers: { "Content-Range": `bytes ${from}-4999/5000`, ETag: `"${DIGEST}"` } });
const cut = () => new Response(body(BLOB, 2000), { status: 200, headers: { "Content-Length": "5000", ETag: `"${DIGEST}"` } });

test("a broken transfer resumes with Range and If-Range", async () => {
  const { impl, seen } = scripted([cut, () => partial(2000)]);
  const got = await fetchShard("http://h/", DIGEST, 5000, { fetchImpl: impl, sleep: noSleep, token: "t" });
  assert.deepEqual(got, BLOB);
  assert.equal(seen.length, 2);
  assert.equal(seen[0].url, `http://h/v1/shards/${DIGEST}`);
  assert.equal(seen[0].headers.Authorization, "Bearer t");
  assert.equal(seen[0].redirect, "manual");
  assert.equal(seen[1].headers.Range, "bytes=2000-");
  assert.equal(seen[1].headers["If-Range"], `"${DIGEST}"`);
});

test("a 200 to a Range request restarts from byte 0", async () => {
  const { impl, seen } = scripted([cut, () => ok()]);
  assert.deepEqual(await fetchShard("http://h", DIGEST, 5000, { fetchImpl: impl, sleep: noSleep }), BLOB);
  assert.equal(seen.length, 2);
});

test("a 206 of another range is not spliced in", async () => {
  const { impl, seen } = scripted([cut, () => partial(1000), () => ok()]);
  assert.deepEqual(await fetchShard("http://h", DIGEST, 5000, { fetchImpl: impl, sleep: noSleep }), BLOB);
  assert.equal(seen.length, 3);
  assert.equal(seen[2].headers.Range, undefined);
});

test("bytes that do not hash to the digest are refetched once, then refused", async () => {
  const bad = BLOB.slice();
  bad[10] ^= 1;
  const { impl, seen } = scripted([() => new Response(body(bad), { status: 200 })]);
  await assert.rejects(fetchShard("http://h", DIGEST, 5000, { fetchImpl: impl, sleep: noSleep }), { name: "ShardIntegrityError" });
  assert.equal(seen.length, 2);
});

test("another size, another ETag, more bytes than announced: refused", async () => {
  for (const [resp, expected] of [
    [() => ok({ "Content-Length": "5001" }), 5000],
    [() => ok({ ETag: `"${"0".repeat(64)}"` }), 5000],
    [() => new Response(body(BLOB), { status: 200 }), 4000],
  ]) {
    const { impl } = scripted([resp]);
    await assert.rejects(fetchShard("http://h", DIGEST, expected, { fetchImpl: impl, sleep: noSleep }), { name: "ShardIntegrityError" });
  }
});

test("no redirect is followed; 404 and 401 say what they are", async () => {
  const cases = [
    [() => new Response(null, { status: 302, headers: { Location: "http://elsewhere/x" } }), "RedirectRefusedError"],
    [() => new Response("no such shard", { status: 404 }), "ShardNotFoundError"],
    [() => new Response("token", { status: 401 }), "AuthError"],
    [() => new Response("gone", { status: 410 }), "ShardUnavailableError"],
  ];
  for (const [resp, name] of cases) {
    const { impl, seen } = scripted([resp]);
    await assert.rejects(fetchShard("http://h", DIGEST, 5000, { fetchImpl: impl, sleep: noSleep }), { name });
    assert.equal(seen.length, 1);
  }
});

test("transient statuses and network errors are retried with backoff; Sakura-Retry: no is not", async () => {
  const slept = [];
  const sleep = async (s) => slept.push(s);
  const down = () => new Response("busy", { status: 503 });
  const { impl, seen } = scripted([down, () => { throw new TypeError("fetch failed"); }, () => ok()]);
  assert.deepEqual(await fetchShard("http://h", DIGEST, 5000, { fetchImpl: impl, sleep }), BLOB);
  assert.equal(seen.length, 3);
  assert.deepEqual(slept, [0.25, 0.5]);
  const never = scripted([down]);
  await assert.rejects(fetchShard("http://h", DIGEST, 5000, { fetchImpl: never.impl, sleep: noSleep, maxAttempts: 4 }),
    { name: "ShardUnavailableError" });
  assert.equal(never.seen.length, 4);
  const final = scripted([() => new Response("bad", { status: 500, headers: { "Sakura-Retry": "no" } })]);
  await assert.rejects(fetchShard("http://h", DIGEST, 5000, { fetchImpl: final.impl, sleep: noSleep }), { name: "ShardUnavailableError" });
  assert.equal(final.seen.length, 1);
});
