"""``sakura examples``: the example templates published into a store, the user images written, reruns idempotent."""

from __future__ import annotations

import pytest
from PIL import Image

from cloud_server.examples import USER_IMAGES
from cloud_server.store import LocalStore
from sakura_core.cli import main

from .conftest import new_s3_store


@pytest.mark.slow
def test_examples_command(tmp_path, capsys):
    store, inputs = tmp_path / "store", tmp_path / "ComfyUI" / "input"
    inputs.parent.mkdir()
    argv = ["examples", "--store", str(store), "--comfyui-input", str(inputs), "--template", "face-swap-astronaut"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"face-swap-astronaut: published in {store}" in out
    assert LocalStore(store).list_templates() == ["face-swap-astronaut"]
    for name in USER_IMAGES:
        with Image.open(inputs / name) as img:
            assert img.size == (128, 128)
    assert main(argv) == 0  # a rerun keeps what is there
    assert "face-swap-astronaut: already published" in capsys.readouterr().out


@pytest.mark.slow
def test_examples_command_publishes_into_an_s3_store(radosgw, capsys):
    store = new_s3_store(radosgw, "examples")
    argv = [
        "examples",
        "--store",
        str(store.location),
        "--s3-endpoint",
        radosgw.endpoint_url,
        "--template",
        "face-swap-astronaut",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"face-swap-astronaut: published in {store.location}" in out
    assert f"--s3-endpoint {radosgw.endpoint_url}" in out  # the serve line names the endpoint too
    assert store.list_templates() == ["face-swap-astronaut"]
    assert main(argv) == 0
    assert "face-swap-astronaut: already published" in capsys.readouterr().out


def test_examples_command_names_a_bad_store_url(capsys):
    assert main(["examples", "--store", "gs://bucket/x", "--template", "face-swap-astronaut"]) == 2
    assert "unsupported scheme 'gs'" in capsys.readouterr().err


def test_examples_command_refuses_a_missing_comfyui_folder(tmp_path, capsys):
    argv = [
        "examples",
        "--store",
        str(tmp_path / "s"),
        "--comfyui-input",
        str(tmp_path / "no" / "input"),
        "--template",
        "face-swap-astronaut",
    ]
    assert main(argv) == 2  # before computing anything
    assert not (tmp_path / "s").exists()
    assert "give ComfyUI's input folder" in capsys.readouterr().err


def test_unknown_example_template_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["examples", "--store", "/nonexistent", "--template", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_examples_publish_the_serving_profile_unless_told_full(tmp_path, monkeypatch, capsys):
    """``sakura examples`` keeps the serving profile by default; ``--store-profile full`` keeps the fp16 (what the
    fetch-fp16 tests need)."""
    import cloud_server.examples as examples
    import cloud_server.precompute as precompute
    from sakura_core.models.edit_model import load_demo_model

    asked = []
    monkeypatch.setattr(precompute, "publish_template", lambda *a, store_profile, **k: asked.append(store_profile))
    monkeypatch.setattr("sakura_core.models.edit_model.load_demo_model", lambda: load_demo_model(weights=None))
    examples.publish_examples(tmp_path / "a", template_ids=["face-swap-astronaut"])
    argv = ["examples", "--store", str(tmp_path / "b"), "--template", "face-swap-astronaut"]
    assert main([*argv, "--store-profile", "full"]) == 0
    assert asked == ["serving", "full"]
