"""The phone agent's SIMULATED phone-scale section runs the job's step count (issue 44: an 8-step job's section
said 4 steps, the phone-class geometry's default, and its latency was that of a 4-step edit)."""

from __future__ import annotations

import pytest

from android_bridge.simulated import simulate_phone_job
from sakura_core.fetch.traces import Trace
from sakura_core.runtime.profiles import PROFILES

from .test_simulated_references import _manifest


@pytest.mark.parametrize("steps", [1, 8, 12])
def test_the_simulated_job_runs_the_jobs_steps(steps):
    profile = PROFILES["snapdragon-8-elite-cpu"]
    assert profile.model.steps == 4  # the phone-class geometry's default: not what these jobs ask
    sim = simulate_phone_job(_manifest("tpl", 1), "on-device", profile, steps=steps, trace=Trace.constant(50.0))
    assert sim["steps"] == steps
    # on-device: the template tokens at every step, every layer: fixed + steps x layers full layers (hand-derived)
    expected_s = profile.fixed_s + steps * profile.model.layers * profile.layer_full_s
    assert sim["latency_s"] == pytest.approx(expected_s, abs=1e-3)


def test_steps_must_be_given_and_valid():
    with pytest.raises(TypeError, match="steps"):
        simulate_phone_job(_manifest("tpl", 1), "on-device", PROFILES["snapdragon-8-elite-cpu"])
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        simulate_phone_job(_manifest("tpl", 1), "on-device", PROFILES["snapdragon-8-elite-cpu"], steps=0)
