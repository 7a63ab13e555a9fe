"""The phone agent runs the same core edit as the ComfyUI sampler (``sakura_core.edit.run_template_edit``, spied
here on an in-process agent with the real edit) and returns the same report format as a local edit."""

from __future__ import annotations

import numpy as np
import pytest

from android_bridge.agent import AgentConfig, create_app
from android_bridge.client import PhoneClient, PhoneJob
from sakura_core import edit
from sakura_core.edit_report import REPORT_KEYS
from sakura_core.runtime.live_profile import LiveProfile

from .conftest import PHONE_TOKEN, PROMPT, TEMPLATE_ID

pytestmark = pytest.mark.slow


async def test_the_agent_calls_the_core_edit_and_reports_like_a_local_edit(
    aiohttp_server, monkeypatch, cloud, demo_model, user_image
):
    calls = []
    real = edit.run_template_edit

    async def spy(model, opened, user, settings, **kwargs):
        calls.append((opened.template_id, settings))
        return await real(model, opened, user, settings, **kwargs)

    monkeypatch.setattr(edit, "run_template_edit", spy)
    profile = LiveProfile(0.01, 0.005, demo_model.adapter.num_layers, 2)
    app = create_app(AgentConfig(token=PHONE_TOKEN, port=0), model=demo_model, live_profile=profile)
    server = await aiohttp_server(app)
    client = PhoneClient.connect(str(server.make_url("")).rstrip("/"), PHONE_TOKEN, check=False)
    try:
        job = PhoneJob(
            cloud_url=cloud.url,
            template_id=TEMPLATE_ID,
            prompt=PROMPT,
            steps=2,
            seed=4,
            policy="fetch-fp16",
            bandwidth="fixed:100",
        )
        image, report = await client.arun_job(user_image, job)
    finally:
        client.close()
    settings = edit.EditSettings(PROMPT, 2, 4, edit.FetchSettings("fetch-fp16", "fixed:100"))
    assert calls == [(TEMPLATE_ID, settings)] and str(calls[0][1].link) == "fixed:100"

    request = edit.EditRequest(edit.ServerSource(cloud.url), TEMPLATE_ID, settings)
    local = await edit.edit_from_server(demo_model, request, user_image, profile=profile)
    assert len(calls) == 2  # the local edit went through the same function
    assert tuple(report) == tuple(local.report) == REPORT_KEYS
    np.testing.assert_array_equal(image, local.image)
    assert report["image_sha256"] == local.report["image_sha256"] and report["link"] == "fixed:100"
    assert report["executed_on"]["kind"] == "phone" and local.report["executed_on"] == {"kind": "local"}
