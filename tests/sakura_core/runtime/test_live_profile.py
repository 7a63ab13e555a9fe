"""The live profile says how many CPU threads the model computes with, so the live planner and the simulator's
replay of a live run charge the decode threads that share the host's cores with it."""

import os
from types import SimpleNamespace

import pytest
import torch

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.live_profile import LiveProfile, measure_profile
from sakura_core.runtime.simulate import simulate


def _model(device: str):
    adapter = SimpleNamespace(device=torch.device(device), num_layers=3)
    return SimpleNamespace(adapter=adapter, layer_times_s=lambda: (0.2, 0.1))


def test_a_cpu_model_on_every_core_shares_them_with_the_decodes(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    p = measure_profile(_model("cpu"), steps=2)
    assert (p.layer_full_s, p.layer_cached_s, p.layers, p.steps) == (0.2, 0.1, 3, 2)
    assert p.dit_cpu_cores == 4
    assert measure_profile(_model("meta"), steps=2).dit_cpu_cores == 0  # weights off the CPU: nothing shared
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # two cores left free: a decode takes none of the DiT's
    assert measure_profile(_model("cpu"), steps=2).dit_cpu_cores == 0


def test_the_replay_of_a_live_run_charges_decode_contention():
    # fetch-fp16 on a fast link: both 1 MB shards arrive at once and decode 0.5 s each, back to back; layer 0
    # (waiting for the first decode) overlaps the second one whole: with 2 threads the DiT loses 0.5 / 2 s
    lv = [Level("q", 1_000_000, 1_000_000, 0.5, 1e-4)]
    ladders, floors = {"sakura": [lv, lv], "fp16": [lv, lv]}, {"sakura": 0, "fp16": 0}
    alone = LiveProfile(layer_full_s=2.0, layer_cached_s=1.0, layers=2, steps=1)
    shared = LiveProfile(layer_full_s=2.0, layer_cached_s=1.0, layers=2, steps=1, dit_cpu_cores=2)
    r0 = simulate(make_policy("fetch-fp16"), Trace.constant(800), alone, ladders, floors)
    r = simulate(make_policy("fetch-fp16"), Trace.constant(800), shared, ladders, floors)
    assert r0.cpu.contention_s == 0.0
    assert r.cpu.contention_s == pytest.approx(0.25) and r.result.latency_s == pytest.approx(
        r0.result.latency_s + 0.25
    )
