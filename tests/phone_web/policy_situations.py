"""The policy conformance suite's hand-made situations: the worlds of the Python policy tests
(``tests/sakura_core/policy/test_policies.py``: 4 layers, 1.0 / 0.5 s per full / cached layer, a 2.0 s template
pass, 2 steps, s1 / s2 / fp16 shards of 1 / 2 / 4 MB, a 0.05 s round trip), each call recorded like a simulated
one (:class:`~tests.phone_web.policy_record.Recorder`); a situation may set the policy's rule constants as a test
does (``constants``: the JS replay sets the same)."""

from __future__ import annotations

from sakura_core.policy.context import Context
from sakura_core.policy.estimator import EstimatorConfig, ThroughputEstimator
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from tests.sakura_core.policy.test_policies import FP16, LADDER, MB, S1, FakeState

from .policy_record import Recorder

__all__ = ["situations"]

_BETTER = [S1, Level("s2", 2 * MB, 1 * MB, 0.0, 0.5e-3, progressive=True), FP16]
_LATE = {"template_alive": False, "compute_layer": 1, "next_layer": 4}


def _ctx(rate, **kw) -> Context:
    """The tests' world with one throughput sample at ``rate`` bytes/s (None: no sample, the prior)."""
    est = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1))
    if rate is not None:
        est.observe(rate, 1.0)
    return Context(FakeState(estimator=est, **kw))


# (name, policy, rule constants, [(call, args, state)]): one sequence each, calls in order on one policy
_SITUATIONS = [
    ("split", "sakura", {}, [("choose", 0, (1e6, {})), ("choose", 1, (1e6, {})), ("keep_template", 0, (1e6, {})),
                             ("choose", 2, (1e6, {}))]),
    ("fast-and-slow", "sakura", {}, [("choose", 0, (16e6, {})), ("keep_template", 0, (16e6, {})),
                                     ("choose", 3, (1e5, {})), ("keep_template", 3, (1e5, {}))]),
    ("regret-1", "sakura", {}, [("keep_template", 0, (4e6, {}))]),
    ("regret-4", "sakura", {"regret_slowdown": 4.0}, [("keep_template", 0, (4e6, {}))]),
    ("probe", "sakura", {}, [("choose", 0, (None, {}))]),
    *[(f"floor-{t}", "sakura", {}, [("choose", 1, (1e6, {"template_alive": False, "compute_t": t,
                                                        "got": {0: [(0, 0.0)]}, "next_layer": 1}))]) for t in (2.0, 2.7)],
    *[(f"target-{t}", "sakura", {}, [("choose", 1, (4e6, {"template_alive": False, "got": {0: [(0, 0.0)]},
                                                         "next_layer": 1, "latency_target_s": t}))])
      for t in (None, 3.0, 4.2, 5.0)],
    ("drop-ready", "sakura", {}, [("keep_template", 2, (1e6, {"compute_layer": 2, "compute_t": 2.0, "now": 2.0,
                                                              "next_layer": 4, "got": {2: [(0, 1.05)], 3: [(0, 1.9)]}}))]),
    *[(f"outage-{t}", "sakura", {}, [("keep_template", 2, (1e6, {"compute_layer": 2, "compute_t": 2.0, "now": 2.0,
                                                                 "link_free": t, "next_layer": 4, "got": {2: [(0, 1.05)]},
                                                                 "in_flight": {3: t}}))]) for t in (2.1, 3.3)],
    *[(f"late-{r:g}", "sakura", {"stall_budget": 1.0},
       [("recompute_late", 1, (r, {**_LATE, "compute_t": 1.0, "now": 1.0})),
        ("recompute_late", 1, (r, {**_LATE, "compute_t": 1.5, "now": 1.5}))]) for r in (1e6, 2e6)],
    ("upgrade", "sakura", {}, [("upgrade", None, (1e6, {"got": {0: [(1, 1.0)], 2: [(0, 2.0)]}})),
                               ("upgrade", None, (1e6, {"got": {0: [(1, 1.0)]}}))]),
    # a sequence has one set of ladders (recorded at its first call)
    ("upgrade-better", "sakura", {}, [("upgrade", None, (1e6, {"ladders": [LADDER, LADDER, LADDER, _BETTER],
                                                               "got": {2: [(0, 2.0)], 3: [(0, 3.0)]}}))]),
    ("baselines-fp16", "fetch-fp16", {}, [("choose", 0, (1e6, {})), ("keep_template", 0, (1e6, {}))]),
    ("baselines-device", "on-device", {}, [("choose", 0, (1e6, {})), ("keep_template", 0, (1e6, {}))]),
]  # fmt: skip # keep: a table: one situation a row


def situations() -> list[dict]:
    """The recorded sequences of the hand-made situations."""
    seqs: list[dict] = []
    for name, policy, constants, calls in _SITUATIONS:
        inner = make_policy(policy)
        for attr, value in constants.items():
            setattr(inner, attr, value)
        rec = Recorder(
            inner, seqs, {"world": f"situation/{name}", "trace": "constant-8", "start_s": 0.0, "constants": constants}
        )
        rec.reset()
        for call, arg, (rate, state) in calls:
            ctx = _ctx(rate, **state)
            getattr(rec, call)(ctx, *(() if arg is None else (arg,)))
    return seqs
