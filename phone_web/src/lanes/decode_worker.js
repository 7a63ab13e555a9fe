// A worker of the page's decode pool (decode_pool.js): a module worker that decodes one shard per message
// ({id, blobs: ArrayBuffer[], slot}) and answers {id, k, v} (float32, their buffers transferred) or {id, error}.
// Workers see no import map, so fzstd's URL is set before the decoders are imported (zstd.js reads it); the handler
// is in place before that import ends, so no message is lost.
globalThis.SAKURA_FZSTD_URL = new URL("../../vendor/fzstd.mjs", import.meta.url).href;
const loaded = import("./decode_job.js");

self.onmessage = async ({ data: { id, blobs, slot } }) => {
  try {
    const { decodeJob } = await loaded;
    const { k, v } = await decodeJob(blobs, slot);
    self.postMessage({ id, k, v }, [k.buffer, v.buffer]);
  } catch (e) {
    self.postMessage({ id, error: `${e.name}: ${e.message}` });
  }
};
