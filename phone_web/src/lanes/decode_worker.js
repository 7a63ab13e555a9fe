// A worker of the page's decode pool (decode_pool.js): a module worker that decodes one shard per message
// ({id, blobs: ArrayBuffer[], slot, reference}) and answers {id, k, v} (float32, their buffers transferred) or {id, error}.
// Workers see no import map, so fzstd's URL is set before the decoders are imported (zstd.js reads it); the handler
// is in place before that import ends, so no message is lost. {id, warm: true} only loads them (DecodePool.warm).
globalThis.SAKURA_FZSTD_URL = new URL("../../vendor/fzstd.mjs", import.meta.url).href;
const loaded = import("./decode_job.js");

self.onmessage = async ({ data: { id, blobs, slot, reference = null, warm = false } }) => {
  try {
    const { decodeJob, warmJob } = await loaded;
    if (warm) { // the decoders imported and their tables built, nothing decoded (DecodePool.warm)
      warmJob();
      self.postMessage({ id, warm: true });
      return;
    }
    const { k, v } = await decodeJob(blobs, slot, reference);
    self.postMessage({ id, k, v }, [k.buffer, v.buffer]);
  } catch (e) {
    self.postMessage({ id, error: `${e.name}: ${e.message}` });
  }
};
