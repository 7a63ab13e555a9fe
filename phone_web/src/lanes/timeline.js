// What the page's lanes report as they go (sakura_core/runtime/run_log.py and timeline.py): every lane's events
// ({lane: "fetch" | "decode" | "compute" | "stall", start, end, layer (the shard's g; -1 for the template image),
// level}), the policy's decisions ({t, layer, level, reason, code}: the rule the reason names, the codes of
// tests/phone_web/policy_record.py), the fallbacks, and each lane's busy seconds (spans merged; compute less its stalls).

export class RunLog {
  constructor() { this.reset(); }

  reset() {
    this.events = [];
    this.decisions = [];
    this.fallbacks = [];
  }

  event(lane, start, end, layer, level) {
    this.events.push({ lane, start, end, layer, level });
  }

  /** call: "choose", "keep_template", "recompute_late", "upgrade", "device" (a fallback). */
  decision(t, layer, level, reason, call = "choose") {
    this.decisions.push({ t, layer, level, reason, code: reasonCode(call, reason, level) });
  }

  fallback(what) { this.fallbacks.push(what); }
}

/** The rule a decision's reason names (policy_record.py's codes; "drop", "recompute", "upgrade", "device" besides;
 *  "other" for a reason no rule here names). */
export function reasonCode(call, reason, level = null) {
  if (call === "keep_template") return level === "drop" ? "drop" : "keep";
  if (call === "recompute_late") return "recompute";
  if (call === "upgrade") return "upgrade";
  if (call === "device") return "device";
  if (reason.endsWith("never fetches: the device computes the template KV")) return "never-fetches";
  if (reason.includes("waits for the bandwidth probe")) return "probe-waits";
  if (reason.includes("(the quality floor;")) return "floor";
  if (reason.includes("slack under the")) return "target";
  const prefixes = [["bandwidth probe", "probe"], ["compute is already past", "past-compute"],
    ["device computes step", "defer"], ["always the exact level", "fp16-exact"],
    ["the exact level fp16 is not in this store", "fp16-nearest"]];
  for (const [prefix, code] of prefixes) if (reason.startsWith(prefix)) return code;
  return "other"; // a reason no rule here names (the page's tests require none: add its rule above)
}

/** Union of [start, end] spans, sorted, overlaps merged, empty ones dropped. */
export function mergeSpans(spans) {
  const out = [];
  for (const [s, e] of spans.filter(([a, b]) => b > a).sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
    if (out.length && s <= out[out.length - 1][1]) out[out.length - 1][1] = Math.max(out[out.length - 1][1], e);
    else out.push([s, e]);
  }
  return out;
}

function subtract(a, b) {
  const out = [];
  for (const [s, e] of a) {
    let cur = s;
    for (const [bs, be] of b) {
      if (be <= cur || bs >= e) continue;
      if (bs > cur) out.push([cur, bs]);
      cur = Math.max(cur, be);
    }
    if (cur < e) out.push([cur, e]);
  }
  return out;
}

const length = (spans) => spans.reduce((s, [a, b]) => s + b - a, 0);
const spansOf = (events, lane) => mergeSpans(events.filter((e) => e.lane === lane).map((e) => [e.start, e.end]));

/** Busy seconds per lane: {fetch, decode, compute (its spans less the stalls), stall}. */
export function busyS(events) {
  return { fetch: length(spansOf(events, "fetch")), decode: length(spansOf(events, "decode")),
    compute: length(subtract(spansOf(events, "compute"), spansOf(events, "stall"))), stall: length(spansOf(events, "stall")) };
}

/** Whether some event of lane ``a`` overlaps some event of lane ``b`` in time (a pipelined run). */
export function lanesOverlap(events, a, b) {
  const bs = events.filter((e) => e.lane === b);
  return events.some((x) => x.lane === a && bs.some((y) => x.start < y.end && y.start < x.end));
}
