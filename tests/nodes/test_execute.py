"""The nodes executed against the real core: demo model, a real ``sakura serve`` with a precomputed template, the
pipelined runtime; interruption and readable errors (stand-in ComfyUI API)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import numpy as np
import pytest
import torch

from sakura_core.fetch.sources import ServerSource

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_model_loader_demo(node_classes, run_node, demo_model):
    (model,) = run_node(node_classes["SakuraModelLoader"], model_name="demo (embedded)")
    assert model.model_id == demo_model.model_id


def test_template_loader_from_server(flow, demo_model, server_url):
    template = flow.load_template(demo_model, server_url=server_url + "/")
    assert template.template_id == "face-swap-astronaut"
    assert template.source == ServerSource(server_url) and template.server is not None
    assert template.model_id == demo_model.model_id
    manifest = template.manifest.to_json()
    assert len(manifest["shards"]) == demo_model.adapter.num_layers
    assert manifest["token_grid"] == list(demo_model.spec.grid) and manifest["template_image"]["bytes"] > 0
    assert "fp16" in {rep["name"] for rep in manifest["shards"][0]["representations"]}


def test_template_loader_errors_are_readable(comfy, flow, demo_model, server_url, tmp_path):
    err = comfy.nodes._common.SakuraNodeError
    with pytest.raises(
        err, match=rf"'no-such' is not in the catalog of {server_url}; published there: face-swap-astronaut"
    ):
        flow.load_template(demo_model, server_url=server_url, template_id="no-such")
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(
        err, match=rf"cannot reach the SAKURA server at {closed} \(connection refused\) — is `sakura serve` running\?"
    ):
        flow.load_template(demo_model, server_url=closed)
    with pytest.raises(err, match=r"^server_url '127.0.0.1:8080' must start with http:// or https://"):
        flow.load_template(demo_model, server_url="127.0.0.1:8080")
    with pytest.raises(err, match="is not a SAKURA store"):
        flow.load_template(demo_model, source="local store", store_dir=str(tmp_path))
    with pytest.raises(err, match="store_dir is empty"):
        flow.load_template(demo_model, source="local store")


def test_template_checked_against_the_model(comfy, flow, demo_model, server_url, store_dir):
    from sakura_core.models.edit_model import ModelSpec, load_demo_model

    other = load_demo_model(ModelSpec(**{**ModelSpec.load().__dict__, "init_seed": 1}), weights=None)
    assert other.model_id != demo_model.model_id
    err = comfy.nodes._common.SakuraNodeError
    with pytest.raises(err, match="computed for model .* precompute it for this model"):
        flow.load_template(other, server_url=server_url)
    with pytest.raises(err, match="precompute it for this model"):
        flow.load_template(other, source="local store", store_dir=str(store_dir))
    # a stream loaded for one model cannot be sampled with another
    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="on-device")
    with pytest.raises(err, match="connect the same Sakura Model Loader to both nodes"):
        flow.sample(other, stream, torch.rand(1, 64, 64, 3))


def test_sampler_on_device_equals_the_core_edit(flow, demo_model, server_url, user, user_uint8, progress):
    """on-device: the template runs here every step, so the node's image must equal the core's run_edit exactly."""
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.denoise import run_edit

    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="on-device")
    edited, report_json, timeline = flow.sample(demo_model, stream, user, steps=3, seed=5)
    opened = stream.join().result()  # the prefetch: sakura_core.edit.open_template
    tmpl = opened.template_image(64)
    L = demo_model.adapter.num_layers
    expected = run_edit(
        demo_model,
        load_image(user_uint8, 64),
        flow.prompt,
        steps=3,
        seed=5,
        split_layer=L,
        template_image=tmpl,
        template_every_step=True,
    ).image
    got = (edited[0].numpy() * 255).round().astype(np.uint8)
    assert edited.shape == (1, 64, 64, 3) and edited.dtype == torch.float32
    np.testing.assert_array_equal(got, expected)
    report = json.loads(report_json)
    assert report["policy"] == "on-device" and report["bytes_fetched"] == 0
    assert report["template"]["image_bytes"] == len(opened.image_file) > 0
    assert report["timeline"][0]["level"] == "template image" and report["timeline"][0]["end"] <= 0
    assert report["levels_used"] == "none fetched" and report["summary"].startswith("on-device: ")
    assert timeline.ndim == 4 and timeline.shape[0] == 1 and timeline.shape[-1] == 3 and timeline.shape[2] > 200
    # the progress bar went layer by layer to steps * layers, on this node's id
    values = [v for v, _, _ in progress.updates]
    assert values[-1] == 3 * L and {t for _, t, _ in progress.updates} == {3 * L}
    assert values == sorted(values) and {n for _, _, n in progress.updates} == {"7"}


def test_sampler_fetch_fp16_equals_edit_from_server(flow, demo_model, server_url, user, user_uint8):
    """fetch-fp16 always fetches every shard exactly: the node must give what the core's edit entry point gives."""
    from sakura_core.edit import EditRequest, EditSettings, FetchSettings, edit_from_server
    from sakura_core.edit_report import REPORT_KEYS
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.live_profile import measure_profile

    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="fetch-fp16", bandwidth="fixed Mbit/s", mbit=50.0)
    edited, report_json, _ = flow.sample(demo_model, stream, user, steps=2, seed=1)
    report = json.loads(report_json)
    assert report["link"] == "fixed:50" and report["split_layer"] == 0
    assert report["bytes_fetched"] >= demo_model.adapter.kv_bytes(demo_model.spec.num_tokens)
    assert all(levels == ["fp16", "fp16"] for levels in report["levels_used"].values())
    u = load_image(user_uint8, 64)
    settings = EditSettings(flow.prompt, 2, 1, FetchSettings("fetch-fp16", "fixed:50"))
    request = EditRequest(ServerSource(server_url), flow.template, settings)
    core = asyncio.run(edit_from_server(demo_model, request, u, profile=measure_profile(demo_model, 2)))
    np.testing.assert_array_equal((edited[0].numpy() * 255).round().astype(np.uint8), core.image)
    assert tuple(report) == tuple(core.report) == REPORT_KEYS  # one report format
    assert report["image_sha256"] == core.report["image_sha256"]


def test_sampler_from_a_local_store_with_the_adaptive_policy(flow, demo_model, store_dir, user):
    template = flow.load_template(demo_model, source="local store", store_dir=str(store_dir))
    assert template.server is None and template.source.label.startswith("store:")
    stream = flow.make_stream(template, policy="sakura", bandwidth="trace file")
    edited, report_json, _ = flow.sample(demo_model, stream, user, steps=2)
    report = json.loads(report_json)
    assert edited.shape == (1, 64, 64, 3)
    assert report["policy"] == "sakura" and report["template"]["source"].startswith("store:")
    assert report["link"].startswith("trace:") and report["link"].endswith("norway_bus_1")
    assert "/" not in report["summary"] and report["summary"].endswith("trace norway_bus_1")
    assert report["decisions"] and all("reason" in d for d in report["decisions"])
    assert report["fallbacks"] == []


def test_the_sampler_calls_the_core_edit(comfy, flow, demo_model, server_url, user, monkeypatch):
    """No orchestration in the node: its edit is one call of sakura_core.edit.run_template_edit (spied here), with
    the edit's one settings object, whose policy name was checked once (counted here) on its way from the fetch node
    to the lanes."""
    from sakura_core import edit, edit_settings

    calls, checked = [], []
    real, real_check = edit.run_template_edit, edit_settings.runnable_policy

    async def spy(model, opened, user_image, settings, **kwargs):
        calls.append((opened.template_id, settings))
        return await real(model, opened, user_image, settings, **kwargs)

    monkeypatch.setattr(edit, "run_template_edit", spy)
    monkeypatch.setattr(edit_settings, "runnable_policy", lambda name: checked.append(name) or real_check(name))
    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="fetch-fp16", bandwidth="fixed Mbit/s", mbit=40.0)
    _, report_json, _ = flow.sample(demo_model, stream, user, steps=1, seed=2)
    assert checked == ["fetch-fp16"]  # the fetch node's settings; the sampler did not check the name again
    fetch = edit.FetchSettings("fetch-fp16", "fixed:40")
    assert calls == [(flow.template, edit.EditSettings(flow.prompt, 1, 2, fetch))]
    assert str(calls[0][1].link) == "fixed:40"
    assert json.loads(report_json)["executed_on"] == {"kind": "local"}


def test_interrupt_stops_between_layers(comfy, flow, demo_model, server_url, user, progress):
    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="on-device")
    stream.join().result()  # prefetch done, so the interrupt lands in the edit
    progress.interrupt_at = 2
    steps = 200  # long enough that it cannot finish before the interrupt is seen
    with pytest.raises(comfy.mm.InterruptProcessingException):
        flow.sample(demo_model, stream, user, steps=steps)
    L = demo_model.adapter.num_layers
    assert 2 <= max(v for v, _, _ in progress.updates) < steps * L
    assert not any(t.name == "sakura-edit" for t in threading.enumerate())  # the edit stopped, not abandoned


def test_sampler_input_errors_are_readable(comfy, flow, demo_model, server_url):
    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="on-device")
    err = comfy.nodes._common.SakuraNodeError
    with pytest.raises(err, match="batch of 2 images"):
        flow.sample(demo_model, stream, torch.rand(2, 64, 64, 3))
    with pytest.raises(err, match=r"expected a ComfyUI IMAGE \(batch, height, width, 3\)"):
        flow.sample(demo_model, stream, torch.rand(64, 64, 3))
    # a lone surrogate (a pasted half of an emoji): refused before anything runs (issue 28; main failed later)
    with pytest.raises(err, match=r"lone surrogate.*type that part again.*\(widget 'prompt'\)"):
        flow.sample(demo_model, stream, torch.rand(1, 64, 64, 3), prompt="swap \ud83d")


def test_prefetch_failure_is_readable_and_retried(comfy, flow, demo_model, server_url, user):
    """A server that went away: the sampler says so (with the template id); the next run fetches again."""
    template = flow.load_template(demo_model, server_url=server_url)
    gone = type(template)(
        template.template_id, template.model_id, ServerSource(f"http://127.0.0.1:{free_port()}"), template.manifest
    )
    stream = flow.make_stream(gone, policy="on-device")
    for attempt in (1, 2):
        with pytest.raises(comfy.nodes._common.SakuraNodeError, match=r"'face-swap-astronaut'.*unavailable"):
            flow.sample(demo_model, stream, user)
        assert stream.attempts == attempt  # the second run started the failed prefetch again
