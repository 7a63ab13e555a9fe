"""The Sakura nodes inside a real ComfyUI (``COMFYUI_DIR``): listed in /object_info, example workflows served, and
every API-format example workflow run through /prompt to an output image in /history, and the tests' two-reference
workflow (``workflows.TEST_WORKFLOWS``, not shipped). DEVELOPERS.md says how.

ComfyUI runs with ``--base-directory`` in a temp folder (custom_nodes/sakura -> this repo, input/ with the example
user images, output/), so the checkout is never written to. ``COMFYUI_PYTHON`` names its interpreter (default: this
one); it needs ComfyUI's requirements and this project (``pip install -e . --no-deps`` plus its runtime deps).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from .conftest import start_comfyui, stop_process

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
if not COMFYUI_DIR:
    pytest.skip(
        "COMFYUI_DIR is not set: the real-ComfyUI test needs a ComfyUI checkout (see DEVELOPERS.md)",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[2]
API = REPO / "example_workflows" / "api"
NODE_IDS = {
    "SakuraModelLoader",
    "SakuraTemplateLoader",
    "SakuraAdaptiveFetch",
    "SakuraPipelinedSampler",
    "SakuraPhoneDevice",
    "SakuraTemplateKV",
    "SakuraTemplateKVReport",
}
RUN_TIMEOUT_S = 600.0
# UI-only workflows on ComfyUI's native klein nodes (klein_workflows.py): listed, never run here, since they need the
# real klein 4B files (a tiny klein's Qwen3 / VAE cannot be loaded by CLIPLoader / VAELoader):
# test_klein_workflows_comfyui.py checks them against this ComfyUI's /object_info instead
KLEIN_UI = ["sakura_klein_face_swap", "sakura_klein_per_step_edit", "sakura_klein_try_on"]


def _get(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _post(url: str, payload: dict | None, timeout: float = 30.0):
    data = json.dumps(payload or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
            return json.loads(body) if body else {}
    except urllib.error.HTTPError as e:
        raise AssertionError(f"POST {url} -> HTTP {e.code}: {e.read()[:2000].decode(errors='replace')}") from e


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory, examples, demo_model, store_dir, comfyui_python, workflow_defs):
    base = tmp_path_factory.mktemp("comfyui-base")
    examples.publish_examples(store_dir, demo_model, list(examples.TEMPLATES))  # every example template
    workflow_defs.publish_two_references(store_dir, demo_model)
    proc, url, log = start_comfyui(COMFYUI_DIR, base, examples, python=comfyui_python)
    try:
        yield url, base, log
    finally:
        stop_process(proc)


def _run(url: str, workflow: dict) -> dict:
    client_id = uuid.uuid4().hex
    queued = _post(f"{url}/prompt", {"prompt": workflow, "client_id": client_id})
    assert not queued.get("node_errors"), queued
    prompt_id = queued["prompt_id"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        history = _get(f"{url}/history/{prompt_id}")
        if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
            entry = history[prompt_id]
            if entry["status"].get("status_str") in ("success", "error"):
                return entry
        time.sleep(0.5)
    raise AssertionError(f"prompt {prompt_id} did not finish within {RUN_TIMEOUT_S} s")


def _prepared(name: str, server_url: str, phone_url: str, phone_token: str, wf: dict | None = None) -> dict:
    """The shipped API-format workflow ``name`` (or ``wf``) with this run's URLs and token, and 4 steps."""
    wf = wf if wf is not None else json.loads((API / f"{name}.json").read_text())
    for node in wf.values():
        inputs = node["inputs"]
        if node["class_type"] == "SakuraTemplateLoader":
            inputs["server_url"] = server_url
        if node["class_type"] == "SakuraPhoneDevice":
            inputs["connection"], inputs["token"] = phone_url, phone_token
        if node["class_type"] == "SakuraPipelinedSampler":
            inputs["steps"] = 4  # CPU time; the workflows ship with 8
    return wf


def test_object_info_lists_every_sakura_node(comfyui):
    url, _, log = comfyui
    info = _get(f"{url}/object_info")
    missing = NODE_IDS - set(info)
    assert not missing, f"not registered: {missing}\n{''.join(log[-60:])}"
    for node_id in NODE_IDS:
        assert info[node_id]["category"] == "sakura"
        assert info[node_id]["python_module"].endswith("sakura")
    assert info["SakuraPipelinedSampler"]["output"] == ["IMAGE", "STRING", "IMAGE"]


def test_example_workflows_are_served(comfyui):
    url, _, _ = comfyui
    listed = _get(f"{url}/api/workflow_templates")
    assert sorted(listed["sakura"]) == sorted([p.stem for p in API.glob("*.json")] + KLEIN_UI)
    ui = _get(f"{url}/api/workflow_templates/sakura/sakura_face_swap.json")
    assert {n["type"] for n in ui["nodes"]} >= NODE_IDS - {
        "SakuraPhoneDevice",
        "SakuraTemplateKV",
        "SakuraTemplateKVReport",
    }  # the demo model's


@pytest.mark.parametrize("name", sorted(p.stem for p in API.glob("*.json")))
def test_api_workflow_runs(comfyui, server_url, phone_url, phone_token, name):
    url, base, _ = comfyui
    workflow = _prepared(name, server_url, phone_url, phone_token)
    template_id = next(n for n in workflow.values() if n["class_type"] == "SakuraTemplateLoader")["inputs"]
    entry = _run(url, workflow)
    status = entry["status"]
    assert status["status_str"] == "success", f"{name}: {json.dumps(status['messages'])[:3000]}"
    outputs = entry["outputs"]
    saved = outputs["6"]["images"]
    assert len(saved) == 1 and (base / "output" / saved[0]["subfolder"] / saved[0]["filename"]).is_file()
    name_, n = re.fullmatch(r"(.+)_(\d+)_\.png", saved[0]["filename"]).groups()  # Save Image's <prefix>_<n>_.png
    beside = base / "output" / saved[0]["subfolder"]
    assert json.loads((beside / f"{name_}_report_{n}.json").read_text()) == json.loads(outputs["8"]["text"][0])
    assert (beside / f"{name_}_timeline_{n}.png").is_file()  # the sampler saved both next to the image
    assert outputs["7"]["images"], "timeline preview missing"
    report = json.loads(outputs["8"]["text"][0])
    assert report["template"]["template_id"] == template_id["template_id"]
    if name.endswith("on_phone"):
        assert report["executed_on"]["kind"] == "phone"


def test_two_reference_workflow_runs(comfyui, server_url, phone_url, phone_token, node_classes, workflow_defs):
    """A template of two reference images through every node in ComfyUI: the report lists both, and with EMULATED
    phone timing their KV is fetched."""
    url, _, _ = comfyui
    schemas = {node_id: cls.GET_SCHEMA() for node_id, cls in node_classes.items()}
    _, api = workflow_defs.render("sakura_two_references", schemas)
    entry = _run(url, _prepared("sakura_two_references", server_url, phone_url, phone_token, api))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"]["messages"])[:3000]
    report = json.loads(entry["outputs"]["8"]["text"][0])
    assert report["template"]["template_id"] == workflow_defs.TWO_REFERENCES[0]
    assert [r["name"] for r in report["template"]["references"]] == ["person", "garment"]
    levels = report["levels_used"]  # {layer: [level per step]}, or "none fetched"
    assert isinstance(levels, dict) and any(lv.startswith("sakura-") for names in levels.values() for lv in names), (
        report["summary"]
    )


def test_interrupt_stops_the_sampler(comfyui, server_url, phone_url, phone_token):
    url, _, _ = comfyui
    wf = _prepared("sakura_face_swap", server_url, phone_url, phone_token)
    sampler = next(n for n in wf.values() if n["class_type"] == "SakuraPipelinedSampler")
    sampler["inputs"].update(steps=200, seed=12345)  # template every step, 200 steps: tens of seconds of work
    next(n for n in wf.values() if n["class_type"] == "SakuraAdaptiveFetch")["inputs"]["policy"] = "on-device"
    queued = _post(f"{url}/prompt", {"prompt": wf, "client_id": uuid.uuid4().hex})
    prompt_id = queued["prompt_id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until it is running
        if any(item[1] == prompt_id for item in _get(f"{url}/queue")["queue_running"]):
            break
        time.sleep(0.2)
    time.sleep(3.0)  # inside the sampler by now
    t0 = time.monotonic()
    _post(f"{url}/interrupt", None)
    entry = _run_wait(url, prompt_id, 60)
    stopped_s = time.monotonic() - t0
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds, kinds
    assert stopped_s < 5.0, f"the sampler took {stopped_s:.1f} s to stop"


def _run_wait(url: str, prompt_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        history = _get(f"{url}/history/{prompt_id}")
        if prompt_id in history and history[prompt_id].get("status", {}).get("status_str") in ("success", "error"):
            return history[prompt_id]
        time.sleep(0.2)
    raise AssertionError(f"prompt {prompt_id} did not stop within {timeout_s} s")
