"""The simulator's cross-step rule: a residual level decodes only after its reference shard (the same layer of the
step it names); without a decoded reference the shard's exact level is fetched instead, and the decision says so."""

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import CrossStepLinks, Level
from sakura_core.policy.policies import Decision, Policy
from sakura_core.runtime.oracle import fixed_split_policy
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import SimConfig, simulate

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=2
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)
FP = G.shard_bytes_fp16
EXACT = Level("fp16", FP, FP, 1e-3, 0.0)
BASE = [Level("q", FP // 6, FP // 6, 1e-3, 1e-5), EXACT]
RESIDUAL = [Level("q", FP // 20, FP // 20, 1e-3, 1e-5, links=CrossStepLinks(ref_step=0)), EXACT]
LADDERS = {"sakura": [BASE] * 4 + [RESIDUAL] * 4}
NO_RTT = SimConfig(rtt_s=0.0)


def _sim(splits, mbit=1000.0):
    return simulate(fixed_split_policy(splits), Trace.constant(mbit), P, LADDERS, {"sakura": 0}, config=NO_RTT)


def test_a_residual_decodes_after_its_reference_and_costs_only_its_bytes():
    r = _sim([0, 0])
    assert r.result.bytes_fetched == 4 * BASE[0].nbytes + 4 * RESIDUAL[0].nbytes
    dec = {e["layer"]: e for e in r.result.events if e["lane"] == "decode"}
    assert all(dec[4 + i]["start"] >= dec[i]["end"] for i in range(4))
    assert not [d for d in r.result.decisions if "needs shard" in str(d["reason"])]


def test_the_devices_own_kv_of_a_layer_serves_as_a_reference():
    r = _sim([2, 0])  # step 0 computes layers 0-1 on the device: step 1's residuals of layers 0-1 decode against it
    assert not [d for d in r.result.decisions if "needs shard" in str(d["reason"])]
    assert r.result.bytes_fetched == 2 * BASE[0].nbytes + 4 * RESIDUAL[0].nbytes


def test_a_residual_whose_reference_was_never_decided_is_fetched_exact():
    ladders = {
        "sakura": [BASE] * 4
        + [[Level("q", FP // 20, FP // 20, 1e-3, 1e-5, links=CrossStepLinks(ref_step=1)), EXACT]] * 4
    }
    r = simulate(fixed_split_policy([0, 0]), Trace.constant(1000.0), P, ladders, {"sakura": 0}, config=NO_RTT)
    fallback = [d for d in r.result.decisions if "needs shard" in str(d["reason"])]  # names step 1 itself: never there
    assert [d["layer"] for d in fallback] == [4, 5, 6, 7] and all("fetching it exact" in d["reason"] for d in fallback)
    assert r.result.bytes_fetched == 4 * BASE[0].nbytes + 4 * EXACT.nbytes


class _LateThenResidual(Policy):
    """Step 0: drop at layer 0, fetch every shard (at a link too slow for them: the device's fallback pass makes step
    0's KV); step 1: every shard at its residual level."""

    name = "late-then-residual"

    def choose(self, ctx, g):
        return Decision(0, "residual or base level")

    def keep_template(self, ctx, g):
        return False

    def recompute_late(self, ctx, g):
        return ctx.step_of(g) == 0


def test_a_fallback_passs_kv_serves_as_the_next_steps_reference():
    r = simulate(_LateThenResidual(), Trace.constant(0.05), P, LADDERS, {"sakura": 0}, config=NO_RTT)
    assert any(d["level"] == "device" for d in r.result.decisions)  # step 0's KV came from the device's pass
    assert not [
        d for d in r.result.decisions if "needs shard" in str(d["reason"])
    ]  # step 1's residuals decode against it
