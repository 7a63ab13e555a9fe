// The fetch-policy protocol, as sakura_core/policy/base.py and policies.py: Decision, the Policy base (fetch nothing)
// and the baselines the page runs (on-device, fetch-fp16). A policy answers choose(ctx, shard) (a level index,
// LEVEL_COMPUTE, or null = stop fetching, each with its reason), keepTemplate(ctx, shard), upgrade(ctx),
// worthAsking(ctx, shards), recomputeLate(ctx, shard) and rerootChain(ctx, shard); it is deterministic given what it is shown.
import { fixed } from "./pyfloat.js";

export const LEVEL_COMPUTE = -1; // pseudo level: the device computes this shard's template KV

export function mb(nbytes) {
  return `${fixed(nbytes / 1e6, 2)} MB`;
}

/** level: ladder index, LEVEL_COMPUTE or null; defer (with LEVEL_COMPUTE): "not now", ask again;
 *  linkIdleUntilS: the link's next decision no earlier than this (seconds, or null). */
export class Decision {
  constructor(level, reason, { linkIdleUntilS = null, defer = false } = {}) {
    this.level = level;
    this.reason = reason;
    this.linkIdleUntilS = linkIdleUntilS;
    this.defer = defer;
    Object.freeze(this);
  }
}

/** Base: fetch nothing, compute everything once (on-device-cached). */
export class Policy {
  static policyName = "base";
  static family = "sakura"; // which ladder this policy fetches from
  static templateEveryStep = false;

  get name() { return this.constructor.policyName; }
  get family() { return this.constructor.family; }
  get templateEveryStep() { return this.constructor.templateEveryStep; }

  reset() {}

  choose(_ctx, _layer) {
    return new Decision(null, `${this.name} never fetches: the device computes the template KV`);
  }

  keepTemplate(_ctx, _layer) { return true; }

  /** [shard, level] to refine with its progressive enhancement, or null. */
  upgrade(_ctx) { return null; }

  /** Of the deferred shards, those worth asking choose() about again now (default: all). */
  worthAsking(_ctx, shards) { return shards; }

  /** Shards to fetch before `layer` (at its floor), only as references that put its layer back on its twins' track
   *  (asked only where the runtime fetches them: ctx.reroots); default none. */
  rerootChain(_ctx, _layer) { return []; }

  /** The template is dropped and the shard is not ready: run a template pass on the device instead? */
  recomputeLate(_ctx, _layer) { return false; }
}

export class OnDevice extends Policy {
  static policyName = "on-device";
  static templateEveryStep = true;
}

export class OnDeviceCached extends Policy {
  static policyName = "on-device-cached";
}

export class FetchFP16 extends Policy {
  static policyName = "fetch-fp16";
  static family = "fp16";

  choose(ctx, layer) {
    const level = ctx.ladder(layer)[0];
    if (level.name !== "fp16") {
      return new Decision(0, `the exact level fp16 is not in this store (store profile serving): the nearest it holds, ${level.name} (${mb(level.nbytes)})`);
    }
    return new Decision(0, `always the exact level ${level.name} (${mb(level.nbytes)})`);
  }

  keepTemplate() { return false; }
}
