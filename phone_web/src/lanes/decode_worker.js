// A worker of the page's decode pool (decode_pool.js): a module worker that decodes one shard per message
// ({id, blobs: ArrayBuffer[], slot}) and answers {id, k, v} (float32, their buffers transferred) or {id, error}.
// Workers see no import map, so fzstd's URL is set before the decoders are imported (zstd.js reads it).
globalThis.SAKURA_FZSTD_URL = new URL("../../vendor/fzstd.mjs", import.meta.url).href;
const { decodeJob } = await import("./decode_job.js");

self.onmessage = async ({ data: { id, blobs, slot } }) => {
  try {
    const { k, v } = await decodeJob(blobs, slot);
    self.postMessage({ id, k, v }, [k.buffer, v.buffer]);
  } catch (e) {
    self.postMessage({ id, error: `${e.name}: ${e.message}` });
  }
};
