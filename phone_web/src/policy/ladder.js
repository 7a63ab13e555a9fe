// The ladder rules the policies read, as sakura_core/policy/ladder.py: a Level is a plain object
// { name, nbytes, incrementBytes, decodeS, mse, progressive, refStep, reuse, closed, offTrack } (bytes, seconds,
// output MSE share); `closed` is the level's closed-loop twin (a Level) or null.

/** A Level from Python's field names (the conformance vectors' JSON). */
export function levelFromJson(j) {
  return Object.freeze({
    name: j.name,
    nbytes: j.nbytes,
    incrementBytes: j.increment_bytes,
    decodeS: j.decode_s,
    mse: j.mse,
    progressive: Boolean(j.progressive),
    refStep: j.ref_step ?? null,
    reuse: Boolean(j.reuse),
    closed: j.closed ? levelFromJson(j.closed) : null,
    offTrack: j.off_track ?? null,
  });
}

/** What a fetch of this level is planned at: its twin's bytes when it is below the open-loop floor. */
export function expectedNbytes(lv) {
  return lv.closed !== null && lv.offTrack !== null ? lv.closed.nbytes : lv.nbytes;
}

/** The quality floor of shard g: one index for every ladder, or one per shard. */
export function shardFloor(floor, g) {
  return typeof floor === "number" ? floor : floor[g];
}

/** Indices a policy may pick with its floor at `floor` (above a reuse rung only those no worse than it). */
export function levelsFrom(ladder, floor) {
  const out = [];
  for (let j = floor; j < ladder.length; j++) {
    if (!ladder[floor].reuse || j === floor || ladder[j].mse <= ladder[floor].mse) out.push(j);
  }
  return out;
}

/** What a choice of level `index` fetches: [ladder index, as its closed-loop twin?]. */
export function fetchAs(ladder, index, onTrack) {
  const lv = ladder[index];
  if (lv.closed === null) return [index, false];
  if (onTrack && (lv.offTrack !== null || lv.closed.nbytes <= lv.nbytes)) return [index, true];
  return [lv.offTrack === null ? index : lv.offTrack, false];
}

/** The bytes a choice of level `index` fetches on or off its twins' track. */
export function fetchBytes(ladder, index, onTrack) {
  const [j, twin] = fetchAs(ladder, index, onTrack);
  return (twin ? ladder[j].closed : ladder[j]).nbytes;
}

/** A shard held at ladder[level] is what the next step's same layer decodes its twin of that level against. */
export function feedsTwin(ladder, level, nextLadder) {
  const name = ladder[level].name;
  return nextLadder.some((lv) => lv.name === name && lv.closed !== null);
}
