"""``sakura phone run`` against an agent started with ``--backend qnn`` (the per-layer context binaries on the EMULATED
Hexagon HTP) returns an edit within 40 dB PSNR of the same job on a ``--backend torch`` agent, for a fetched-KV policy
and for ``on-device``; ``/v1/info`` and the report say which backend ran, that the HTP is emulated, and the op
coverage. Marked ``npu``: skipped with the reason when onnxruntime-qnn is absent (with ``CI=true`` on linux x86-64:
failed). The context binaries are built once per test session (conftest ``qnn_backend``) into a temporary cache,
which the agent process then loads (no rebuild)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from sakura_core.metrics import psnr_uint8

from .conftest import PHONE_TOKEN, PROMPT, TEMPLATE_ID, AgentProcess

pytestmark = pytest.mark.npu
EDIT_PSNR_DB_BOUND = 40.0


@pytest.fixture(scope="module")
def qnn_agents(qnn_backend, qnn_cache):
    """A ``--backend qnn`` agent loading the session's context binaries from their cache, and a torch agent."""
    procs = {"qnn": AgentProcess("--backend", "qnn", "--qnn-cache", str(qnn_cache)), "torch": AgentProcess()}
    try:
        yield {name: proc.url() for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.stop()


def _phone_run(agent: str, cloud, image_path, out, policy: str, capsys) -> dict:
    from sakura_core.cli import main

    report = out.with_suffix(".json")
    rc = main(["phone", "run", "--agent", agent, "--token", PHONE_TOKEN, "--cloud", cloud.url, "--template",
               TEMPLATE_ID, "--image", str(image_path), "--prompt", PROMPT, "--out", str(out), "--policy", policy,
               "--steps", "2",
               "--seed", "5", "--report", str(report), "--quiet"])  # fmt: skip # keep: flags beside their values
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    return json.loads(report.read_text())


def test_info_reports_the_backend_the_emulation_and_the_op_coverage(qnn_agents):
    from android_bridge import PhoneClient

    with PhoneClient.connect(qnn_agents["qnn"], PHONE_TOKEN) as client:
        compute = client.info()["compute"]
    assert compute["backend"] == "qnn" and compute["emulated_htp"] is True and "EMULATED" in compute["htp"]
    assert compute["op_coverage"]["fraction_on_htp"] == 1.0 and compute["op_coverage"]["cpu_fallback"] == "disabled"
    assert compute["graphs"] == 12 and compute["precision"] == "w8a16"
    with PhoneClient.connect(qnn_agents["torch"], PHONE_TOKEN) as client:
        assert client.info()["compute"]["backend"] == "torch"


@pytest.mark.parametrize("policy", ["fetch-fp16", "on-device"])
def test_phone_run_on_the_emulated_htp_matches_the_torch_agent(
    qnn_agents, cloud, user_image, tmp_path, policy, capsys, record_property
):
    image_path = tmp_path / "user.png"
    Image.fromarray(user_image).save(image_path)
    reports, images = {}, {}
    for name in ("torch", "qnn"):
        out = tmp_path / f"{name}.png"
        reports[name] = _phone_run(qnn_agents[name], cloud, image_path, out, policy, capsys)
        images[name] = np.asarray(Image.open(out).convert("RGB"))
    psnr = psnr_uint8(images["qnn"], images["torch"])
    record_property("psnr_db_qnn_vs_torch", round(psnr, 2))
    assert psnr >= EDIT_PSNR_DB_BOUND, psnr
    device = reports["qnn"]["executed_on"]["device"]
    assert device["backend"]["backend"] == "qnn" and device["backend"]["emulated_htp"] is True
    assert "EMULATED" in device["compute"]
    assert reports["torch"]["executed_on"]["device"]["backend"]["backend"] == "torch"
    assert reports["qnn"]["fallbacks"] == [] and reports["qnn"]["policy"] == policy  # no silent fallback to torch


PER_STEP_ID = "tpl-astro-per-step"


@pytest.fixture(scope="module")
def per_step_template(store, demo_model):
    """``PER_STEP_ID``: the same template published with per-step KV for the 2-step schedule the runs use."""
    from cloud_server.precompute import publish_template
    from sakura_core.models.edit_model import load_image

    image = load_image("astronaut", demo_model.spec.image_size)
    publish_template(store, demo_model, image, PER_STEP_ID, codec="fp16", kv_mode="per-step", steps=2)
    return PER_STEP_ID


@pytest.mark.parametrize("policy", ["fetch-fp16", "on-device"])
def test_per_step_phone_run_on_the_emulated_htp_matches_the_torch_agent(
    qnn_agents, cloud, user_image, tmp_path, per_step_template, policy, capsys, record_property
):
    from sakura_core.cli import main

    image_path = tmp_path / "user.png"
    Image.fromarray(user_image).save(image_path)
    images, reports = {}, {}
    for name in ("torch", "qnn"):
        out, report = tmp_path / f"{name}.png", tmp_path / f"{name}.json"
        rc = main(["phone", "run", "--agent", qnn_agents[name], "--token", PHONE_TOKEN, "--cloud", cloud.url,
                   "--template", per_step_template, "--image", str(image_path), "--prompt", PROMPT, "--out", str(out),
                   "--policy", policy, "--steps", "2",
                   "--seed", "5", "--report", str(report), "--quiet"])  # fmt: skip # keep: flags beside their values
        assert rc == 0, capsys.readouterr().err
        images[name] = np.asarray(Image.open(out).convert("RGB"))
        reports[name] = json.loads(report.read_text())
    assert reports["qnn"]["kv_mode"] == "per-step" and reports["qnn"]["fallbacks"] == []
    psnr = psnr_uint8(images["qnn"], images["torch"])
    record_property("psnr_db_qnn_vs_torch", round(psnr, 2))
    assert psnr >= EDIT_PSNR_DB_BOUND, psnr
