"""A diffusers FLUX.2 [klein] KV pipeline folder through the ComfyUI nodes (stand-in API): listed and loaded by the
Model Loader from models/diffusers, its template precomputed with ``sakura precompute --model FOLDER`` and served by a
real ``sakura serve --model FOLDER``, fetched with a policy and edited here and on a real (emulated) phone agent that
runs the same folder; a per-step template of the folder (the model's own schedule) from the server, from a local
store and on the phone."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from .conftest import PHONE_TOKEN, start_process, stop_process

pytestmark = pytest.mark.slow
TID = "klein-face"
TID_PER_STEP = "klein-face-per-step"


@pytest.fixture(scope="module")
def diffusers_klein(comfy, tmp_path_factory, klein_folder):
    """models/diffusers holding the klein folder (and nothing else)."""
    root = tmp_path_factory.mktemp("models") / "diffusers"
    shutil.copytree(klein_folder, root / "tiny-klein")
    saved = comfy.folder_paths.folder_names_and_paths["diffusers"]
    comfy.folder_paths.folder_names_and_paths["diffusers"] = ([str(root)], {"folder"})
    try:
        yield root / "tiny-klein"
    finally:
        comfy.folder_paths.folder_names_and_paths["diffusers"] = saved


@pytest.fixture(scope="module")
def klein_store(tmp_path_factory, klein_folder):
    """A store with the folder's templates: ``TID`` (single KV mode) and ``TID_PER_STEP`` (per-step, 2 steps)."""
    from sakura_core.cli import main

    store = tmp_path_factory.mktemp("klein-store")
    assert (
        main(["precompute", "--store", str(store), "--model", str(klein_folder), "--image", "astronaut", "--id", TID])
        == 0
    )
    assert (
        main(
            [
                "precompute",
                "--store",
                str(store),
                "--model",
                str(klein_folder),
                "--image",
                "astronaut",
                "--id",
                TID_PER_STEP,
                "--kv-mode",
                "per-step",
                "--steps",
                "2",
            ]
        )
        == 0
    )
    return store


@pytest.fixture(scope="module")
def klein_server(klein_store, klein_folder):
    store = klein_store
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "serve",
        "--store",
        str(store),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        str(klein_folder),
    ]
    proc, url, _ = start_process(argv, r"serving (http://\S+)", "sakura serve")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def klein_phone(klein_folder):
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "phone-agent",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--token",
        PHONE_TOKEN,
        "--model",
        str(klein_folder),
    ]
    proc, url, _ = start_process(argv, r"listening on (http://\S+)", "sakura phone-agent")
    try:
        yield url
    finally:
        stop_process(proc)


def test_model_loader_lists_and_loads_the_pipeline_folder(node_classes, run_node, diffusers_klein, klein_model):
    loader = node_classes["SakuraModelLoader"]
    assert loader.GET_SCHEMA().inputs[0].options == ["demo (embedded)", "klein single files (below)", "tiny-klein"]
    # (not tiny-klein/transformer: part of the pipeline)
    (model,) = run_node(loader, model_name="tiny-klein")
    assert model.model_id == klein_model.model_id  # the id derives from the transformer weights
    assert model.spec.grid == (4, 4) and model.weights_source == "folder:tiny-klein"


def test_klein_edit_here_and_on_the_phone(
    comfy, node_classes, run_node, flow, diffusers_klein, klein_server, klein_phone, user
):
    (model,) = run_node(node_classes["SakuraModelLoader"], model_name="tiny-klein")
    template = flow.load_template(model, template_id=TID, server_url=klein_server)
    stream = flow.make_stream(template, policy="sakura", bandwidth="fixed Mbit/s", mbit=50.0)
    image, report_json, _ = flow.sample(model, stream, user, steps=2, seed=3)
    report = json.loads(report_json)
    assert tuple(image.shape) == (1, 64, 64, 3) and report["policy"] == "sakura"
    assert report["template"]["template_id"] == TID and not report.get("fallbacks")

    (device,) = run_node(node_classes["SakuraPhoneDevice"], connection=klein_phone, token=PHONE_TOKEN, cloud_url="")
    assert device.info()["model"]["id"] == model.model_id
    cached = flow.make_stream(template, policy="on-device-cached")
    here, _, _ = flow.sample(model, cached, user, steps=2, seed=3)
    there, phone_json, _ = flow.sample(model, cached, user, steps=2, seed=3, device=device)
    assert json.loads(phone_json)["executed_on"]["kind"] == "phone"
    np.testing.assert_array_equal(there.numpy(), here.numpy())  # the same folder edits the same on the phone


def test_klein_per_step_template_here_from_a_store_and_on_the_phone(
    comfy, node_classes, run_node, flow, diffusers_klein, klein_store, klein_server, klein_phone, user
):
    """Refused before (ScheduleMismatchError: the checks used ``flow_timesteps``, not the folder's schedule)."""
    err = comfy.nodes._common.SakuraNodeError
    (model,) = run_node(node_classes["SakuraModelLoader"], model_name="tiny-klein")
    template = flow.load_template(model, template_id=TID_PER_STEP, server_url=klein_server)
    assert template.kv_mode == "per-step" and template.schedule == "2 steps, shift 1"
    stream = flow.make_stream(template, policy="fetch-fp16", bandwidth="fixed Mbit/s", mbit=50.0)
    here, report_json, _ = flow.sample(model, stream, user, steps=2, seed=3)
    report = json.loads(report_json)
    assert report["kv_mode"] == "per-step" and not report["fallbacks"] and report["bytes_fetched"] > 0
    assert report["split_layers"] == [0, 0] and set(report["levels_used"]) == {"step 0", "step 1"}
    with pytest.raises(err, match="precomputed for 2 steps .*asks 3 — set steps to 2 or precompute"):
        flow.sample(model, stream, user, steps=3)

    local = flow.load_template(model, template_id=TID_PER_STEP, source="local store", store_dir=str(klein_store))
    stored, local_json, _ = flow.sample(model, flow.make_stream(local, policy="fetch-fp16"), user, steps=2, seed=3)
    assert json.loads(local_json)["bytes_fetched"] == report["bytes_fetched"]
    np.testing.assert_array_equal(stored.numpy(), here.numpy())  # the same KV read from the store's folder

    (device,) = run_node(node_classes["SakuraPhoneDevice"], connection=klein_phone, token=PHONE_TOKEN, cloud_url="")
    there, phone_json, _ = flow.sample(model, stream, user, steps=2, seed=3, device=device)
    phone = json.loads(phone_json)
    assert phone["executed_on"]["kind"] == "phone" and phone["kv_mode"] == "per-step" and not phone["fallbacks"]
    np.testing.assert_array_equal(there.numpy(), here.numpy())  # the phone's folder edits the same
