// The fetch lane's gates, as Python's (sakura_core/runtime/deferral.py: ahead_window_bytes, request_gate;
// sakura_core/runtime/lane_rules.py: prefetch_room, has_prefetch_room), each a pure function of what its caller
// passes; tests/phone_web/gate_vectors.py holds the two to the same answers (phone_web/test/run_gate.mjs).

/** Requests sent ahead cover this many round trips of the link at the estimator's rate (AHEAD_WINDOW_RTTS). */
export const AHEAD_WINDOW_RTTS = 2.0;

/** With requests sent ahead, the next request leaves once the bytes requested and not yet received are at most this
 *  many: a bandwidth-delay product, AHEAD_WINDOW_RTTS round trips at the estimator's harmonic rate. null before the
 *  estimator's first sample: the first request is the bandwidth probe, the next leaves once it has arrived. */
export function aheadWindowBytes(estimator, rttS) {
  if (!estimator.samples) return null;
  return AHEAD_WINDOW_RTTS * rttS * estimator.harmonic();
}

/** Whether the next request may leave now (requests ahead), and why: [go, reason]; "probe" (no sample yet: it waits
 *  for the probe's end), "within-window" (leftBytes, requested and not yet received, within the window: it goes),
 *  "beyond-window" (it waits for more of them to arrive). */
export function requestGate(estimator, rttS, leftBytes) {
  const window = aheadWindowBytes(estimator, rttS);
  if (window === null) return [false, "probe"];
  if (leftBytes <= window) return [true, "within-window"];
  return [false, "beyond-window"];
}

/** prefetchRoom's reasons that let the shard be fetched now. */
export const ROOM_GOES = Object.freeze(new Set(["no-cap", "running-step", "room"]));

/** Per-step KV's prefetch room, with its reason: "no-cap" (no budget), "running-step" (flat index g below the
 *  running step's end: never waits), "size-unknown" (shardBytes null: no shard decoded yet, it waits), "room" (the
 *  later steps' KV requested so far, laterBytes, plus its own within cap) or "no-room" (it waits). */
export function prefetchRoom(g, runningEnd, laterBytes, shardBytes, cap) {
  if (cap === null) return "no-cap";
  if (g < runningEnd) return "running-step";
  if (shardBytes === null) return "size-unknown";
  return laterBytes + shardBytes <= cap ? "room" : "no-room";
}

/** Whether a shard may be fetched within the prefetch budget (prefetchRoom's reason is one of ROOM_GOES). */
export function hasPrefetchRoom(g, runningEnd, laterBytes, shardBytes, cap) {
  return ROOM_GOES.has(prefetchRoom(g, runningEnd, laterBytes, shardBytes, cap));
}
