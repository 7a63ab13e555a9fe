"""The phone agent app in-process (aiohttp test client) with a stand-in edit: the job protocol, the queue, the
refusals (401, 400, 409, 413, 415, 422, 429, 502), progress over the WebSocket, cancel, and results."""

from __future__ import annotations

import asyncio
import io
import json
import threading

import aiohttp
import numpy as np
import pytest
from PIL import Image

from android_bridge.agent import AgentConfig, create_app
from android_bridge.wire import CONTENT_TYPE, encode_job_body
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import Cancelled

from .conftest import PHONE_TOKEN, PROMPT, TEMPLATE_ID

AUTH = {"Authorization": f"Bearer {PHONE_TOKEN}"}


class FakeEdit:
    """Stands in for ``sakura_core.edit.edit_from_server``: calls ``on_layer`` from a worker thread for every (step, layer), stops
    on ``cancel`` between layers, waits on ``gate`` before finishing, and returns a deterministic image."""

    def __init__(self, layers: int, fail: Exception | None = None):
        self.layers, self.fail = layers, fail
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.requests = []
        self.prefetch = []

    async def __call__(
        self, model, request, image, *, profile, cancel, on_layer, prefetch_kv_bytes=None, manifest=None
    ):
        self.requests.append((request, image.copy()))
        self.prefetch.append(prefetch_kv_bytes)

        def work():
            self.started.set()
            for step in range(request.settings.steps):
                for layer in range(self.layers):
                    if cancel.is_set():
                        raise Cancelled(f"edit cancelled at step {step}, layer {layer}")
                    on_layer(step, layer)
                    if step == 0 and layer == 0:
                        while not self.gate.wait(0.01):
                            if cancel.is_set():
                                raise Cancelled("edit cancelled while gated")
            if self.fail is not None:
                raise self.fail
            return np.full_like(image, request.settings.seed % 256)

        out = await asyncio.to_thread(work)

        class Outcome:
            pass

        outcome = Outcome()
        outcome.image, outcome.report = (
            out,
            {"policy": request.settings.policy, "latency_s": 0.01, "bytes_fetched": 0, "timeline": []},
        )
        return outcome


@pytest.fixture
def make_agent(aiohttp_client, demo_model):
    async def make(fake: FakeEdit | None = None, **overrides):
        cfg = AgentConfig(**{"token": PHONE_TOKEN, "port": 0, **overrides})
        fake = fake or FakeEdit(demo_model.adapter.num_layers)
        profile = LiveProfile(0.01, 0.005, demo_model.adapter.num_layers, 8)
        app = create_app(cfg, model=demo_model, edit_fn=fake, live_profile=profile)
        return await aiohttp_client(app), fake

    return make


def _body(cloud, image, **job) -> bytes:
    header = {
        "template_id": TEMPLATE_ID,
        "cloud_url": cloud.url,
        "prompt": PROMPT,
        "steps": 2,
        "seed": 5,
        "policy": "fetch-fp16",
        **job,
    }
    return encode_job_body(header, {"image": image})


async def _submit(client, body: bytes, ctype: str = CONTENT_TYPE):
    return await client.post("/v1/jobs", data=body, headers={**AUTH, "Content-Type": ctype})


async def _events(client, job_id: str, *, send: dict | None = None, until=("done", "error", "cancelled")):
    out = []
    async with client.ws_connect(f"/v1/jobs/{job_id}", headers=AUTH) as ws:
        if send is not None:
            await ws.send_json(send)
        async for msg in ws:
            out.append(json.loads(msg.data))
            if out[-1]["type"] in until:
                break
    return out


async def test_info_needs_the_token_and_describes_the_device(make_agent, demo_model):
    client, _ = await make_agent(profile="snapdragon-8-elite-cpu")
    assert (await client.get("/v1/info")).status == 401
    r = await client.get("/v1/info", headers=AUTH)
    info = await r.json()
    assert info["model"]["id"] == demo_model.model_id and info["emulated"] is True
    assert info["profile"]["name"] == "snapdragon-8-elite-cpu" and info["profile"]["npu_session_bytes"] == 0
    assert info["profile"]["memory_budget_bytes"] == 4 * 2**30 and info["job_memory"]["fits"] is True
    assert info["queue"] == {"size": 2, "waiting": 0, "running": None}


async def test_job_lifecycle_progress_result_and_forget(make_agent, cloud, user_image, demo_model):
    client, fake = await make_agent()
    r = await _submit(client, _body(cloud, user_image))
    assert r.status == 202, await r.text()
    sub = await r.json()
    assert sub["ws_url"] == f"/v1/jobs/{sub['job_id']}" and sub["memory"]["fits"]
    events = await _events(client, sub["job_id"])
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "done" and "progress" in kinds and kinds.index("progress") > kinds.index("state")
    last = [e for e in events if e["type"] == "progress"][-1]
    assert last["done"] == last["total"] == 2 * demo_model.adapter.num_layers
    request, image = fake.requests[0]
    assert request.settings.prompt == PROMPT and request.source.url == cloud.url and np.array_equal(image, user_image)
    # the room the job's memory estimate leaves under the budget is lent to KV prefetched for later steps
    mem = sub["memory"]
    assert fake.prefetch == [mem["budget_bytes"] - mem["total_bytes"]] and fake.prefetch[0] > 0
    r = await client.get(sub["result_url"], headers=AUTH)
    assert r.status == 200 and r.headers["Content-Type"].startswith("multipart/mixed")
    reader = aiohttp.MultipartReader.from_response(r)
    report = await (await reader.next()).json()
    png = await (await reader.next()).read()
    ran = report["executed_on"]
    assert ran["kind"] == "phone" and ran["job_id"] == sub["job_id"]
    assert ran["device"]["profile"] == "snapdragon-8-elite-npu"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), np.full_like(user_image, 5))
    assert ran["simulated_phone"]["label"].startswith("SIMULATED")
    status = await (await client.get(f"/v1/jobs/{sub['job_id']}", headers=AUTH)).json()
    assert status["state"] == "done" and status["progress"]["done"] == status["progress"]["total"]
    r = await client.delete(f"/v1/jobs/{sub['job_id']}", headers=AUTH)
    assert (await r.json())["state"] == "deleted"
    assert (await client.get(f"/v1/jobs/{sub['job_id']}", headers=AUTH)).status == 404


@pytest.mark.parametrize("steps", [2, 8])
async def test_every_step_count_in_the_report_is_the_jobs(make_agent, cloud, user_image, steps):
    """The SIMULATED phone section ran the phone geometry's default 4 steps whatever the job asked (issue 44: "4
    steps" for an 8-step job): it runs the job's."""
    client, fake = await make_agent()
    sub = await (await _submit(client, _body(cloud, user_image, steps=steps))).json()
    events = await _events(client, sub["job_id"])
    assert events[-1]["type"] == "done" and fake.requests[0][0].settings.steps == steps
    r = await client.get(sub["result_url"], headers=AUTH)
    report = await (await aiohttp.MultipartReader.from_response(r).next()).json()
    sim = report["executed_on"]["simulated_phone"]
    assert sim["label"].startswith("SIMULATED") and sim["steps"] == steps


async def test_one_job_at_a_time_bounded_queue_and_cancel(make_agent, cloud, user_image, demo_model):
    fake = FakeEdit(demo_model.adapter.num_layers)
    fake.gate.clear()
    client, _ = await make_agent(fake, queue_size=1)
    first = await (await _submit(client, _body(cloud, user_image, seed=1))).json()
    await asyncio.to_thread(fake.started.wait, 10)
    second = await (await _submit(client, _body(cloud, user_image, seed=2))).json()
    assert second["position"] == 1
    r = await _submit(client, _body(cloud, user_image, seed=3))
    assert r.status == 429 and r.headers["Retry-After"] and (await r.json())["code"] == "queue_full"
    info = await (await client.get("/v1/info", headers=AUTH)).json()
    assert info["queue"] == {"size": 1, "waiting": 1, "running": first["job_id"]}
    r = await client.delete(f"/v1/jobs/{second['job_id']}", headers=AUTH)  # queued: cancelled at once
    assert (await r.json())["state"] == "cancelled"
    assert (await _events(client, second["job_id"]))[-1]["type"] == "cancelled"
    events = await _events(client, first["job_id"], send={"type": "cancel"})  # running: stops between layers
    assert events[-1] == {"type": "cancelled", "reason": "cancelled by the host (WebSocket)"}
    r = await client.get(f"/v1/jobs/{first['job_id']}/result", headers=AUTH)
    assert r.status == 410 and (await r.json())["code"] == "cancelled"
    fake.gate.set()
    third = await (await _submit(client, _body(cloud, user_image, seed=3))).json()  # the queue is free again
    assert (await _events(client, third["job_id"]))[-1]["type"] == "done"
    assert [req.settings.seed for req, _ in fake.requests] == [1, 3]  # the cancelled queued job never ran


async def test_result_before_done_is_409_and_a_failed_job_reports_why(make_agent, cloud, user_image, demo_model):
    from sakura_core.fetch.client import FetchError

    fake = FakeEdit(demo_model.adapter.num_layers, fail=FetchError("shard 3: connection reset"))
    fake.gate.clear()
    client, _ = await make_agent(fake)
    sub = await (await _submit(client, _body(cloud, user_image))).json()
    r = await client.get(f"/v1/jobs/{sub['job_id']}/result", headers=AUTH)
    assert r.status == 409 and (await r.json())["state"] in ("queued", "running")
    fake.gate.set()
    events = await _events(client, sub["job_id"])
    assert events[-1]["type"] == "error" and events[-1]["code"] == "fetch_failed"
    assert "connection reset" in events[-1]["error"]
    r = await client.get(f"/v1/jobs/{sub['job_id']}/result", headers=AUTH)
    assert r.status == 410 and (await r.json())["code"] == "fetch_failed"


async def test_bad_requests_are_refused_with_a_reason(make_agent, cloud, user_image):
    client, fake = await make_agent(max_body_bytes=64 * 2**10)
    r = await _submit(client, _body(cloud, user_image), ctype="application/json")
    assert r.status == 415
    r = await _submit(client, b"garbage" * 10)
    assert r.status == 400 and (await r.json())["code"] == "bad_body"
    r = await _submit(client, _body(cloud, user_image[:32]))
    assert r.status == 400 and "(64, 64, 3) uint8" in (await r.json())["error"]
    r = await _submit(client, encode_job_body({"template_id": TEMPLATE_ID, "cloud_url": cloud.url, "prompt": "x"}, {}))
    assert r.status == 400 and (await r.json())["code"] == "bad_image"
    for job, match in (
        ({"steps": 0}, "steps must be >= 1, got 0"),
        ({"steps": 1001}, "steps must be in 1..1000"),
        ({"cloud_url": "ftp://127.0.0.1/"}, "http"),
        ({"bandwidth": "trace:/etc/passwd"}, "reads a file on the phone"),
        ({"policy": "free-kv"}, "cannot run"),
        ({"seed": "7"}, "seed must be an integer"),
        ({"seed": -1}, "seed must be in"),
        ({"template_id": "../etc"}, "template_id must match"),
    ):
        r = await _submit(client, _body(cloud, user_image, **job))
        body = await r.json()
        assert r.status == 400 and body["code"] == "bad_job" and match in body["error"], body
    big = np.random.default_rng(0).integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
    r = await _submit(client, _body(cloud, big))
    assert r.status == 413
    assert fake.requests == []


async def test_over_budget_and_models_it_does_not_hold(make_agent, cloud, store, user_image, demo_model):
    from ..synthetic_templates import make_synthetic_template

    client, _ = await make_agent(memory_budget_bytes=4096)
    r = await _submit(client, _body(cloud, user_image))
    body = await r.json()
    assert r.status == 422 and body["code"] == "over_memory_budget" and body["memory"]["budget_bytes"] == 4096
    assert "over the budget of 0.0 MiB (configured memory budget)" in body["error"]

    client, _ = await make_agent()
    cloud.records.clear()
    r = await _submit(client, _body(cloud, user_image, model_id="cd" * 32))
    body = await r.json()
    assert r.status == 409 and body["code"] == "model_not_held" and body["held_model_id"] == demo_model.model_id
    assert cloud.records == []  # refused before asking the cloud
    make_synthetic_template(store, "tpl-other-model", model_id="ab" * 32)
    r = await _submit(client, _body(cloud, user_image, template_id="tpl-other-model"))
    assert r.status == 409 and (await r.json())["code"] == "model_not_held"
    r = await _submit(client, _body(cloud, user_image, template_id="tpl-missing"))
    assert r.status == 404 and (await r.json())["code"] == "template_not_found"
    r = await _submit(client, _body(cloud, user_image, cloud_url="http://127.0.0.1:9"))  # discard port: closed
    assert r.status == 502 and (await r.json())["code"] == "cloud_unreachable"


def test_config_is_validated():
    with pytest.raises(ValueError, match="at least 8"):
        AgentConfig(token="short")
    with pytest.raises(ValueError, match="unknown device profile 'pixel'"):
        AgentConfig(token=PHONE_TOKEN, profile="pixel")
    with pytest.raises(ValueError, match="queue_size"):
        AgentConfig(token=PHONE_TOKEN, queue_size=-1)
