// The page's fetch policies (a port of sakura_core/policy; the conformance suite tests/phone_web/
// test_policy_conformance.py holds the two together): makePolicy(name), the Context a policy reads, the estimator.
import { FetchFP16, OnDevice, OnDeviceCached } from "./base.js";
import { Sakura } from "./sakura.js";

export { Context } from "./context.js";
export { EstimatorConfig, ThroughputEstimator } from "./estimator.js";
export { levelFromJson } from "./ladder.js";
export { Decision, LEVEL_COMPUTE, Policy } from "./base.js";
export { Sakura };

export const POLICIES = Object.freeze(Object.fromEntries([OnDevice, OnDeviceCached, FetchFP16, Sakura].map((p) => [p.policyName, p])));

export function makePolicy(name) {
  const cls = POLICIES[name];
  if (cls === undefined) throw new RangeError(`unknown policy ${JSON.stringify(name)}; the page runs ${Object.keys(POLICIES).join(", ")}`);
  const p = new cls();
  p.reset();
  return p;
}
