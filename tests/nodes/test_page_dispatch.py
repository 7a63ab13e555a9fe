"""The sampler's dispatch to a paired phone page (``nodes/page_dispatch.run_on_page``) on the stand-in ComfyUI, a
Python thread playing the page over the hub: the image and the report (the one format) come back and the progress
bar moves per step; a page that goes silent is a node error within ``stale_after_s``; an interrupt frees the page and
the page hears the cancel; the Phone Device node refuses ``page`` with no page paired, saying how to pair."""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import pytest

from android_bridge.page_channel import PageHub, PageHubConfig, PairingError
from sakura_core.edit_settings import EditSettings, FetchSettings
from sakura_core.fetch.sources import ServerSource


def _stream(comfy):
    stream_mod = __import__(f"{comfy.nodes.__name__}._stream", fromlist=["KVStream"])
    source = ServerSource("http://127.0.0.1:9", "read-token")
    template = stream_mod.TemplateHandle(template_id="tpl", model_id="m" * 8, source=source)
    return stream_mod.KVStream(template, FetchSettings(policy="sakura", link="fixed:10")), stream_mod


@pytest.fixture
def hub(comfy, monkeypatch):
    hub = PageHub(PageHubConfig(stale_after_s=0.6))
    dispatch = __import__(f"{comfy.nodes.__name__}.page_dispatch", fromlist=["page_hub"])
    monkeypatch.setattr(dispatch, "page_hub", lambda: hub)
    comfy.mm.interrupt_current_processing(False)
    return hub


def _page(hub: PageHub, *, finish: bool = True, beats: int = 3):
    """Pair a page and serve one job from a thread: ``beats`` progress beats, then the result (or silence)."""
    token = hub.pair(hub.new_code()[0], {"browser": "test"})
    seen: dict = {}

    def run() -> None:
        while (job := hub.take_job(token)) is None:
            time.sleep(0.01)
        seen["job"] = job
        for step in range(1, beats + 1):
            try:
                seen["cancel"] = hub.beat(token, job["job_id"], {"phase": "computed", "done": step, "total": beats})
            except PairingError:  # the job was cancelled and dropped: the page's beat answer says so (409)
                seen["cancel"] = True
                return
            time.sleep(0.1)
        if finish:
            rgba = np.full((4, 4, 4), 200, np.uint8)
            report = {
                "template_id": "tpl",
                "steps": beats,
                "seed": 1,
                "policy": "fp16 for every layer",
                "bytes_fetched": 1000,
                "timings_s": {"total": 0.5, "fetch_decode": 0.2, "per_step": [0.1] * beats},
                "executed_on": {"kind": "browser", "execution_provider": "wasm"},
            }
            hub.finish(
                token,
                job["job_id"],
                {"width": 4, "height": 4, "report": report, "rgba_b64": base64.b64encode(rgba.tobytes()).decode()},
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen


def _run(comfy, hub, on_tick=lambda run: None):
    stream, stream_mod = _stream(comfy)
    device_mod = __import__(f"{comfy.nodes.__name__}.phone_device", fromlist=["PhoneDevice"])
    run = stream_mod.EditRun(3, 2)
    user = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    device = device_mod.PhoneDevice(connection="page")
    settings = EditSettings("a prompt", 3, 1, stream.settings)
    return device_mod.run_on_phone(device, stream, user, settings, run=run, on_tick=lambda: on_tick(run)), run


def test_the_page_edit_comes_back_with_progress(comfy, hub):
    from sakura_core.edit_report import REPORT_KEYS

    thread, seen = _page(hub)
    ticks: list[int] = []
    (image, report), _ = _run(comfy, hub, lambda run: ticks.append(run.layers_started))
    thread.join(5)
    assert image.shape == (4, 4, 3) and (image == 200).all()
    assert tuple(report) == REPORT_KEYS and report["executed_on"]["connection"].startswith("page:")
    assert report["executed_on"]["policy_requested"] == "sakura" and report["link"] == "fixed:10"
    job = seen["job"]
    sent = np.frombuffer(base64.b64decode(job["image"]["rgba_b64"]), np.uint8).reshape(4, 4, 4)
    assert (sent[..., :3] == np.arange(48).reshape(4, 4, 3)).all() and (sent[..., 3] == 255).all()
    assert job["prompt"] == "a prompt" and job["cloud_url"] == "http://127.0.0.1:9" and job["steps"] == 3
    assert {2, 4} <= set(ticks)  # whole steps of 2 layers on the bar as the page beat


def test_a_silent_page_is_a_node_error_within_the_bound(comfy, hub):
    thread, _ = _page(hub, finish=False, beats=1)
    t0 = time.monotonic()
    with pytest.raises(
        comfy.nodes._common.SakuraNodeError, match=r"phone page \w+ stopped answering .* \(connection 'page'\)"
    ):
        _run(comfy, hub)
    assert time.monotonic() - t0 < 3.0
    thread.join(5)


def test_an_interrupt_frees_the_page_and_the_page_hears_it(comfy, hub):
    thread, seen = _page(hub, finish=False, beats=8)

    def interrupt(run) -> None:
        if seen.get("job"):
            comfy.mm.interrupt_current_processing(True)

    with pytest.raises(comfy.mm.InterruptProcessingException):
        _run(comfy, hub, interrupt)
    thread.join(5)
    assert hub.pages()[0]["busy"] is False and seen["cancel"] is True
    comfy.mm.interrupt_current_processing(False)


def test_the_node_says_how_to_pair_when_no_page_is(comfy, hub):
    device_mod = __import__(f"{comfy.nodes.__name__}.phone_device", fromlist=["SakuraPhoneDevice"])
    with pytest.raises(
        comfy.nodes._common.SakuraNodeError,
        match=r"no phone page is connected to this ComfyUI: open .* \(the connection field\)",
    ):
        device_mod.SakuraPhoneDevice.execute(connection="page", token="", cloud_url="")
    with pytest.raises(PairingError):
        hub.resolve("page")
