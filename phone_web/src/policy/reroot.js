// Re-rooting a layer on its twins' track, as sakura_core/policy/reroot.py: a layer the device computed at some steps
// comes back on its closed-loop track by its chain of shards from the last step requested (or from step 0, the
// tracks' root), each decoded only as the next one's reference. chainOf: the runtime rule; chainBytes: the
// planner's price of it for a whole plan. Same float operations, in the same order, as the Python.

/** The shards (in fetch order) that put shard g's layer back on its twins' track before g is fetched at its floor
 *  (`requested`: per shard, decoded or on the way); [] where g is on its track, where the last shard requested is
 *  held at another level, where a chain shard's floor is a reuse rung, or where the chain and g's twin cost no
 *  less than g's open-loop floor. */
export function chainOf(ctx, g, requested) {
  const L = ctx.layersPerStep;
  const step = Math.floor(g / L);
  const layer = g % L;
  const chain = [];
  let j = step - 1;
  while (j >= 0 && !requested[j * L + layer]) {
    chain.push(j * L + layer);
    j -= 1;
  }
  if (!chain.length) return [];
  if (j >= 0) {
    const ref = j * L + layer;
    if (ctx.fetchedLevels().get(ref) !== ctx.floorOf(ref)) return [];
  }
  const reuse = ctx.floorReuses();
  if (chain.some((c) => reuse[c])) return [];
  const nb = ctx.floorArrays()[0];
  let total = 0.0;
  for (const c of chain) total += nb[c];
  if (total + nb[g] >= ctx.floorOffTrackBytes()[g]) return [];
  return chain.reverse();
}

/** For every shard the on-track floor bytes of the chain that re-roots its layer before it (the layer at the steps
 *  since the last one in `requested`, back to step 0 when none is; 0 where the step before is requested). */
export function chainBytes(nb, requested, steps) {
  const L = nb.length / steps;
  const out = new Float64Array(nb.length);
  for (let l = 0; l < L; l++) {
    const cum = new Float64Array(steps + 1); // cum[s]: bytes of steps < s, summed left to right (np.cumsum)
    for (let s = 0; s < steps; s++) cum[s + 1] = cum[s] + nb[s * L + l];
    let prev = -1; // the last step requested strictly before s
    for (let s = 0; s < steps; s++) {
      out[s * L + l] = cum[s] - cum[prev + 1];
      if (requested[s * L + l]) prev = s;
    }
  }
  return out;
}
