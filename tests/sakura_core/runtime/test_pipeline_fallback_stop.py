"""The live runtime's fallback template pass is abandonable (``DeviceKV.kv``): run layer by layer through the
backend's ``resume_template_kv(..., stop)``, it stops once every shard of its step from the late one on is made by it or
decoded (``lane_rules.pass_stops_after``; the late shard's own transfer goes on), and the step goes on with the fetched KV.
Per-step demo edit, manual clock."""

import threading
import time
import types

import pytest

from sakura_core.runtime import lane_rules

# setup is a fixture
from .test_pipeline_per_step import _LateThenDevice, _run_with_late_shard, _stall_of, setup  # noqa: F401


def _link_back(real_stop, after=None):
    """``pass_can_stop`` that, once the pass has made layer ``after`` (None: at its first layer), lets the link deliver
    the rest of the step from the late shard on (real time, bounded): the link came back while the pass ran."""

    def stop(late, end, made, ready):
        if after is None or made(after):
            for _ in range(6000):
                if all(made(g) or ready(g) for g in range(late, end)):
                    break
                time.sleep(0.01)
        return real_stop(late, end, made, ready)

    return stop


def _pass_with_link_back(edit_setup, monkeypatch, clock, last_made: int | None):
    """A per-step edit whose policy gives up on step 1 layer 2 at once and whose link delivers the rest of the step
    while the fallback pass runs: right after the give-up (``last_made`` None), or once the pass has made layer
    ``last_made``. The layers the pass made, the report, the layer count."""
    model = edit_setup[0]
    L = model.adapter.num_layers
    made = _record_pass_layers(monkeypatch, model)
    after = None if last_made is None else L + last_made
    monkeypatch.setattr(lane_rules, "pass_can_stop", _link_back(lane_rules.pass_can_stop, after=after))
    pol = _LateThenDevice([0, 0, 0])
    if last_made is not None:
        pol.release = _NeverBefore(made, last_made)  # the late shard (and the link behind it) only then
    return made, _run_with_late_shard(edit_setup, pol, pol.release, clock), L


def _stopped_after(rep, layer: int) -> list:
    return [d for d in rep.result.decisions if f"fallback pass stopped after layer {layer}" in str(d["reason"])]


def test_a_live_fallback_pass_stops_before_the_late_layer_once_the_link_delivers_it(
    setup,  # noqa: F811 - the imported fixture
    monkeypatch,
    manual_clock,
):
    made, rep, L = _pass_with_link_back(setup, monkeypatch, manual_clock, None)
    # the pass resumed at step 1's drop (layer 0) and stopped after its first layer: the given-up shard arrived
    assert made == [0]
    stopped = _stopped_after(rep, 0)
    assert len(stopped) == 1 and stopped[0]["layer"] == L + 2
    by_step = rep.levels_by_step()
    assert by_step["step 1"] == ["fp16"] * L  # the late shard's fetched KV serves: the device made none of it
    assert (rep.tokens - setup[4].tokens).abs().max() < 2e-3  # the stated bound of fp16 KV storage


def test_a_live_fallback_pass_stops_at_the_late_layer_and_the_edit_stays_within_the_fp16_bound(
    setup,  # noqa: F811 - the imported fixture
    monkeypatch,
    manual_clock,
):
    made, rep, L = _pass_with_link_back(setup, monkeypatch, manual_clock, 2)
    assert L >= 4  # layers after the late one (2) are left to the link
    # the pass resumed at step 1's drop (layer 0) and stopped after the late layer: not run to the step's end
    assert made == [0, 1, 2]
    stopped = _stopped_after(rep, 2)
    assert len(stopped) == 1 and stopped[0]["layer"] == L + 2
    by_step = rep.levels_by_step()
    assert by_step["step 1"] == ["fp16", "fp16", "device"] + ["fp16"] * (L - 3)
    assert by_step["step 2"] == ["fp16"] * L
    # the stated bound of fp16 KV storage (the device's own layer is exact)
    assert (rep.tokens - setup[4].tokens).abs().max() < 2e-3


def test_a_live_fallback_pass_runs_to_the_end_while_the_link_has_not_delivered(
    setup,  # noqa: F811 - the imported fixture
    monkeypatch,
    manual_clock,
):
    model, on_device = setup[0], setup[4]
    L = model.adapter.num_layers
    made = _record_pass_layers(monkeypatch, model)
    pol = _LateThenDevice([0, 0, 0])
    pol.release = _NeverBefore(made, L - 1)  # the late shard (and the link behind it) only once the pass is done
    rep = _run_with_late_shard(setup, pol, pol.release, manual_clock)
    assert made == list(range(L))
    assert not any("fallback pass stopped" in str(d["reason"]) for d in rep.result.decisions)
    assert rep.levels_by_step()["step 1"] == ["fp16", "fp16"] + ["device"] * (L - 2)
    assert (rep.tokens - on_device.tokens).abs().max() < 2e-3


def _record_pass_layers(monkeypatch, model) -> list:
    """The layers every fallback pass of ``model`` makes, in order (its ``resume_template_kv`` wrapped)."""
    made, real = [], model.adapter.resume_template_kv

    def resume(h, grid, start, t=None, stop=None):
        return real(h, grid, start, t, lambda layer, kv: made.append(layer) or stop(layer, kv))

    monkeypatch.setattr(model.adapter, "resume_template_kv", resume)
    return made


class _NeverBefore:
    """An event-like release that is set only once ``made`` holds ``last`` (the policy's ``set`` is ignored)."""

    def __init__(self, made: list, last: int) -> None:
        self.made, self.last = made, last

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return self.last in self.made


@pytest.mark.parametrize("step1_split", [0, 1])
def test_a_late_shard_makes_the_live_pipeline_ask_the_policy_and_run_that_steps_template_pass(
    setup,  # noqa: F811 - the imported fixture
    monkeypatch,
    step1_split,
    manual_clock,
):
    model, on_device = setup[0], setup[4]
    resumed, done = [], threading.Event()
    real = model.adapter.resume_template_kv

    def resume(h, grid, start, t=None, stop=None):
        resumed.append(start)
        out = real(h, grid, start, t, stop)
        done.set()
        return out

    monkeypatch.setattr(model.adapter, "resume_template_kv", resume)
    L = model.adapter.num_layers
    pol = _LateThenDevice([0, step1_split, 0])
    # the late shard (and the link behind it) comes once the pass is done: it runs to the step's end
    pol.release = types.SimpleNamespace(set=lambda: None, is_set=done.is_set)
    rep = _run_with_late_shard(setup, pol, pol.release, manual_clock)
    # (a step-0 shard a loaded host's fetch thread delivers late is asked about too, and kept waiting for: the first
    # ask past step 0 is the late shard's)
    assert [g for g in pol.asked_late if g >= L][:1] == [L + 2], pol.asked_late
    # asked at the wait's start, as the simulator asks (lane_rules.late_wait_until; not after shard_wait_s), and the
    # device took over then
    gave_up = next(d for d in rep.result.decisions if d["level"] == "device")
    assert gave_up["layer"] == L + 2 and "template pass on the device is sooner" in gave_up["reason"]
    assert gave_up["t"] - _stall_of(rep, L + 2)["start"] == pytest.approx(0.0, abs=1e-9)
    by_step = rep.levels_by_step()
    assert by_step["step 0"] == ["fp16"] * L
    head = ["template"] * step1_split + ["fp16"] * (2 - step1_split)
    assert by_step["step 1"][:2] == head and by_step["step 1"][2:] == ["device"] * (L - 2)
    assert by_step["step 2"] == ["fp16"] * L  # the next step fetches again
    # the device's template pass resumes where step 1 dropped the template tokens, not from layer 0
    assert resumed == [step1_split]
    assert any(e["level"] == f"fallback template pass from layer {step1_split} (step 1)" for e in rep.result.events)
    assert (rep.tokens - on_device.tokens).abs().max() < 2e-3  # step 1's own KV computed here: still right
