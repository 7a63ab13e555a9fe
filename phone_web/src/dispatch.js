// The page paired with ComfyUI (served by ComfyUI at /sakura/phone: nodes/page_routes.py). It pairs with the code
// ComfyUI shows, then asks for jobs over a bounded long poll (api/job). A job names the image, prompt, template, cloud
// URL, seed and steps; the page loads the web model and fetches the template KV from the cloud itself (never
// ComfyUI's bytes to the cloud), runs the edit (edit.js), beats with its progress while it runs (a cancel from
// ComfyUI's interrupt comes back in the beat's answer) and posts the image and report back to ComfyUI.
import { runEdit } from "./edit.js";
import { createSession, loadWebModel } from "./web_model.js";

const post = (path, body) => fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify(body) });
const sleep = (s) => new Promise((resolve) => setTimeout(resolve, s * 1000));

async function said(answer) {
  return answer.json().then((j) => j.error, () => null);
}

/** Pair with ``code`` (from ComfyUI); {token, code, stale_after_s, hold_s}; an Error with ComfyUI's reason. */
export async function pair(code, info) {
  const answer = await post("api/pair", { code: code.trim().toUpperCase(), info });
  if (!answer.ok) throw new Error((await said(answer)) ?? `pairing answered ${answer.status}`);
  return answer.json();
}

function base64Of(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function bytesOf(b64) {
  return Uint8ClampedArray.from(atob(b64), (c) => c.charCodeAt(0));
}

/** The job's RGBA at the model's size: taken as is when it already is, else its centre square drawn at that size. */
function fitted(image, size) {
  const rgba = bytesOf(image.rgba_b64);
  if (rgba.length !== image.width * image.height * 4) throw new Error(`the job's image is not ${image.width}x${image.height} RGBA`);
  if (image.width === size && image.height === size) return rgba;
  const from = new OffscreenCanvas(image.width, image.height);
  from.getContext("2d").putImageData(new ImageData(rgba, image.width, image.height), 0, 0);
  const side = Math.min(image.width, image.height);
  const ctx = new OffscreenCanvas(size, size).getContext("2d");
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(from, (image.width - side) / 2, (image.height - side) / 2, side, side, 0, 0, size, size);
  return ctx.getImageData(0, 0, size, size).data;
}

/**
 * Serve jobs until the pairing is refused (throws) — ``paired``: pair()'s answer; ``loadOrt(ep)``: onnxruntime-web
 * for an execution provider; ``ui``: {state(text, kind), progress(phase, done, total), result(rgba, size, report)}.
 */
export async function serveJobs(paired, loadOrt, ui) {
  const models = new Map(); // cloud URL -> {model, run}: loaded once per cloud
  addEventListener("pagehide", () => navigator.sendBeacon("api/bye", JSON.stringify({ token: paired.token })));
  ui.state(`Paired with ComfyUI as ${paired.code}: waiting for a job.`, "paired");
  for (;;) {
    let answer;
    try {
      answer = await fetch("api/job", { headers: { Authorization: `Bearer ${paired.token}` } });
    } catch (e) {
      ui.state(`ComfyUI is not reachable (${e.message}); trying again.`, "paired");
      await sleep(1);
      continue;
    }
    if (answer.status === 401) throw new Error(`${await said(answer)}`);
    if (!answer.ok) { await sleep(1); continue; }
    const { job } = await answer.json();
    if (job) await runJob(job, paired, models, loadOrt, ui);
  }
}

async function modelFor(cloud, models, loadOrt, ui) {
  if (!models.has(cloud)) {
    const model = await loadWebModel(`${cloud}/phone/model/`, ui.progress);
    const forced = new URLSearchParams(location.search).get("ep");
    const run = await createSession(loadOrt, model.graph, forced ? [forced] : undefined);
    models.set(cloud, { model, run });
  }
  return models.get(cloud);
}

async function runJob(job, paired, models, loadOrt, ui) {
  const token = paired.token;
  let progress = {};
  let cancelled = false;
  let lastBeat = 0;
  const beat = () => {
    lastBeat = performance.now();
    post("api/beat", { token, job_id: job.job_id, progress }).then((a) => a.json()).then((a) => {
      if (a.cancel === true || a.error) cancelled = true;
    }, () => {});
  };
  const timer = setInterval(beat, 1000);
  ui.state(`Running a job from ComfyUI: template ${job.template_id}, ${job.steps} steps.`, "running");
  try {
    beat();
    const { model, run } = await modelFor(job.cloud_url.replace(/\/+$/, ""), models, loadOrt, ui);
    const size = model.index.image_size;
    const out = await runEdit({ origin: job.cloud_url.replace(/\/+$/, ""), templateId: job.template_id,
      rgba: fitted(job.image, size), prompt: job.prompt, steps: job.steps, seed: job.seed, model, run,
      token: job.cloud_token ?? null, onProgress: (phase, done, total) => {
        if (cancelled) throw new Error("cancelled by ComfyUI");
        progress = { phase, done, total };
        ui.progress(phase, done, total);
        if (performance.now() - lastBeat > 300) beat();
      } });
    if (cancelled) throw new Error("cancelled by ComfyUI");
    const answer = await post("api/result", { token, job_id: job.job_id, width: size, height: size,
      rgba_b64: base64Of(new Uint8Array(out.rgba.buffer)), report: out.report });
    if (!answer.ok) throw new Error(`ComfyUI refused the result: ${await said(answer)}`);
    ui.result(out.rgba, size, out.report);
    ui.state(`Done: sent to ComfyUI (${out.report.executed_on.execution_provider}). Waiting for a job.`, "done");
  } catch (e) {
    ui.state(`Error: ${e.message}`, "error");
    await post("api/error", { token, job_id: job.job_id, message: e.message }).catch(() => {});
  } finally {
    clearInterval(timer);
  }
}
