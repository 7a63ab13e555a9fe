"""LiveState.link_progress: the live pipeline shows the policy the transfer in progress as the simulator does."""

from __future__ import annotations

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.context import Context
from sakura_core.policy.ladder import Level
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.live_state import LiveState
from sakura_core.runtime.pipeline_config import LiveSettings, RuntimeConfig


def _state():
    ladders = [[Level("fp16", 1_000_000, 1_000_000, 0.0, 0.0)] for _ in range(4)]
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=4, steps=1)
    return LiveState(profile, Trace.constant(8.0), ladders, 0, RuntimeConfig(rtt_s=0.0))


def test_no_transfer_no_progress():
    assert _state().link_progress() is None


def test_the_earliest_shard_being_received_is_the_transfer_in_progress():
    st = _state()
    with st.frozen_now() as now:
        st.receiving[3] = [now - 1.0, 5.0, 100.0]
        st.receiving[2] = [now - 4.0, 250.0, 200.0]  # more received than its size (a refetch): clamped
        assert st.link_progress() == pytest.approx((4.0, 200.0, 200.0))
        del st.receiving[2]
        assert st.link_progress() == pytest.approx((1.0, 5.0, 100.0))
        # the policy's view: 5 B in 1 s of a transfer due at 1 MB/s long ago -> the estimate drops to 5 B/s
        assert Context(st).slowed(1e6) == pytest.approx(5.0)


def test_with_requests_ahead_the_transfer_on_the_wire_is_in_progress_not_one_queued_behind_it():
    # a request sent ahead waits for the wire (QUEUED): read as in progress, its long wait with a first chunk only
    # looked like a stalled link and the policy's rate fell to a few bytes/s (it kept the template)
    from sakura_core.runtime.live_state import QUEUED

    st = _state()
    with st.frozen_now() as now:
        st.receiving[1] = [now - 0.5, 400.0, 1000.0]  # on the wire since 0.5 s
        st.receiving[2] = [now - 3.0, 64.0, 1000.0]  # requested 3 s ago, not on the wire yet
        st.on_wire = 1
        assert st.link_progress() == pytest.approx((0.5, 400.0, 1000.0))
        st.on_wire = None  # between two transfers: the queued one is still no transfer in progress
        st.receiving[2][0] = QUEUED
        del st.receiving[1]
        assert st.link_progress() is None
        assert Context(st).slowed(1e6) == pytest.approx(1e6)


def test_the_transfers_before_the_lanes_seed_the_estimator_at_every_reset():
    ladders = [[Level("fp16", 1_000_000, 1_000_000, 0.0, 0.0)] for _ in range(4)]
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=4, steps=1)
    config = RuntimeConfig(
        rtt_s=0.05, live=LiveSettings(pre_lanes=((400_000, 0.45),))
    )  # the template image: 0.4 s after its trip
    st = LiveState(profile, None, ladders, 0, config)
    assert st.estimator.samples == 1 and st.estimator.harmonic() == pytest.approx(1e6)
    st.estimator.observe(500_000, 1.0)
    st.reset()  # a fresh edit: the lanes' samples forgotten, the seed kept
    assert st.estimator.samples == 1 and st.estimator.harmonic() == pytest.approx(1e6)
    assert LiveState(profile, None, ladders, 0, RuntimeConfig()).estimator.samples == 0  # none: the prior
    with pytest.raises(ValueError, match="pre_lanes must be"):
        LiveSettings(pre_lanes=((-1, 0.5),))


def test_an_opened_template_seeds_with_its_image_fetch():
    from sakura_core.edit import OpenedTemplate

    opened = OpenedTemplate(None, "t", "m", None, b"x" * 1000, (10.0, 10.5), (b"x" * 1000, b"y" * 500))
    assert opened.pre_lanes() == ((1500, 0.5),)  # both references, one transfer's round trip taken off later
    assert OpenedTemplate(None, "t", "m", None, b"x", (0.0, 0.0)).pre_lanes() == ()  # not timed: no seed
