"""Fetch policies: which representation of each shard to fetch, or compute it on the device, as the link changes.

Pure and deterministic given a trace, so the simulator and the live pipeline run the same code:

* :mod:`.estimator` — throughput estimation (harmonic mean, RobustMPC error discount);
* :mod:`.ladder` — :class:`Level`, the policies' view of a shard's representations, and :class:`Rung`, a level with
  the manifest entry the lanes fetch for it (:func:`rungs_from_manifest`);
* :mod:`.context` — :class:`Context`, what a policy may look at: a typed view of a :class:`PolicyState` (the
  simulator's or the live pipeline's);
* :mod:`.policies` — the policies (on-device, on-device-cached, fetch-fp16, cachegen, throughput, sakura, oracle,
  free-kv), each decision with its reason;
* :mod:`.plan` — the quality floor and a policy's rungs for one manifest (:func:`plan_fetch`).
"""

from .context import ComputeCosts, Context, PolicyState
from .estimator import EstimatorConfig, ThroughputEstimator
from .ladder import Level, Rung, levels_of, rungs_from_manifest
from .plan import FLOOR_PSNR_DB, FetchPlan, floor_index, plan_fetch, policy_levels, runnable_policies
from .policies import LEVEL_COMPUTE, POLICIES, Decision, Policy, make_policy

__all__ = [
    "FLOOR_PSNR_DB",
    "LEVEL_COMPUTE",
    "POLICIES",
    "ComputeCosts",
    "Context",
    "Decision",
    "EstimatorConfig",
    "FetchPlan",
    "Level",
    "Policy",
    "PolicyState",
    "Rung",
    "ThroughputEstimator",
    "floor_index",
    "levels_of",
    "make_policy",
    "plan_fetch",
    "policy_levels",
    "rungs_from_manifest",
    "runnable_policies",
]
