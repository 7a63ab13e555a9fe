"""The Phone Device node and the sampler dispatching to a real (emulated) phone agent (stand-in ComfyUI API)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import free_port

pytestmark = pytest.mark.slow


def test_phone_device_and_dispatch(
    comfy, node_classes, run_node, flow, demo_model, server_url, phone_url, phone_token, user, progress
):
    phone = node_classes["SakuraPhoneDevice"]
    (device,) = run_node(phone, connection=phone_url, token=phone_token, cloud_url="")
    assert device.info()["model"]["id"] == demo_model.model_id
    assert phone_token not in repr(device)
    template = flow.load_template(demo_model, server_url=server_url)
    stream = flow.make_stream(template, policy="on-device")
    here, here_json, _ = flow.sample(demo_model, stream, user, steps=2, seed=3)
    progress.updates.clear()
    there, report_json, timeline = flow.sample(demo_model, stream, user, steps=2, seed=3, device=device)
    report = json.loads(report_json)
    local = json.loads(here_json)
    assert list(report) == list(local)  # one report format, local and on the phone
    assert report["executed_on"]["kind"] == "phone" and local["executed_on"] == {"kind": "local"}
    assert report["executed_on"]["connection"] == phone_url and report["executed_on"]["cloud_url"] == server_url
    assert report["executed_on"]["device"]["emulated"] is True
    assert report["template"]["template_id"] == flow.template and report["policy"] == "on-device"
    assert "image_sha256" in report and flow.prompt not in report_json  # the prompt stays on the phone
    # the same model, template, policy and seed: the phone's edit is the edit made here
    np.testing.assert_array_equal(there.numpy(), here.numpy())
    assert timeline.shape[0] == 1 and progress.updates and progress.updates[-1][0] == progress.updates[-1][1]


def test_phone_errors_are_readable(
    comfy, node_classes, run_node, flow, demo_model, server_url, store_dir, phone_url, phone_token, user
):
    err = comfy.nodes._common.SakuraNodeError
    phone = node_classes["SakuraPhoneDevice"]
    with pytest.raises(
        err,
        match=rf"the phone agent at {phone_url} refused the token typed into the node's token "
        r"field \(HTTP 401\): it is not the token",
    ):
        run_node(phone, connection=phone_url, token="wrong-token-123", cloud_url="")
    with pytest.raises(err, match=r"cloud_url '127.0.0.1:8080' must start with http:// or https://"):
        run_node(phone, connection=phone_url, token=phone_token, cloud_url="127.0.0.1:8080")
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(
        err, match=rf"cannot reach the phone agent at {closed} \(connection refused\) — is `sakura phone-agent`"
    ):
        run_node(phone, connection=closed, token=phone_token, cloud_url="")
    with pytest.raises(err, match="adb|phone spec"):
        run_node(phone, connection="bluetooth://x", token=phone_token, cloud_url="")
    (device,) = run_node(phone, connection=phone_url, token=phone_token, cloud_url="")
    local = flow.load_template(demo_model, source="local store", store_dir=str(store_dir))
    with pytest.raises(err, match="local store, which the phone cannot reach"):
        flow.sample(demo_model, flow.make_stream(local), user, device=device)
    remote = flow.load_template(demo_model, server_url=server_url)
    traced = flow.make_stream(remote, bandwidth="trace file")
    with pytest.raises(err, match="emulated on this machine only"):
        flow.sample(demo_model, traced, user, device=device)
