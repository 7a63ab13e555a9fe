"""What the live lane tells the policy about a shard on its way (``LiveState.in_flight``): once its bytes have
landed, its predicted ready time is its decode from then — not what was predicted when it was requested (a policy
deciding while the decode runs saw the shard late, and kept the template)."""

import pytest

from sakura_core.policy.context import Context
from sakura_core.runtime.decode_lane import DecodeLane

from .cross_step_edits import StepLevels, cross_step_setup, run_levels

STEPS = 2
FAR = 1e6  # what the policy "predicted" at each request (seconds): wrong on purpose


@pytest.fixture(scope="module")
def setup():
    return cross_step_setup("tpl-pred", STEPS)


@pytest.mark.parametrize("ahead", [False, True], ids=["one-request-at-a-time", "requests-ahead"])
def test_a_landed_shards_prediction_is_its_decode_from_then(setup, ahead, monkeypatch):
    seen = []
    real = DecodeLane.decode_now

    def decode_now(self, shard, *a, **k):
        with self.st.lock:
            seen.append((shard.g, self.st.now, self.st.in_flight.get(shard.g)))
        return real(self, shard, *a, **k)

    monkeypatch.setattr(Context, "predict_ready", lambda self, layer, level, rate: FAR)
    monkeypatch.setattr(DecodeLane, "decode_now", decode_now)
    rep = run_levels(setup, StepLevels(0, [0, 0]), STEPS, chunks=ahead, request_ahead=ahead)
    assert not rep.fallbacks, rep.fallbacks
    L = setup[0].adapter.num_layers
    assert {g for g, _, _ in seen} == set(range(STEPS * L))  # every shard fetched and decoded once
    for g, now, predicted in seen:
        # set when its last blob landed, before this decode started: its decode time from then, not the request's
        assert predicted is not None and predicted <= now + 1.0, (g, now, predicted)
