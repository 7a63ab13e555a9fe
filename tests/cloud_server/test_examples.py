"""``sakura examples``: the example templates published into a store, the user images written, reruns idempotent."""

from __future__ import annotations

import pytest
from PIL import Image

from cloud_server.examples import USER_IMAGES
from cloud_server.store import LocalStore
from sakura_core.cli import main


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


def test_examples_command_refuses_a_missing_comfyui_folder(tmp_path, capsys):
    argv = ["examples", "--store", str(tmp_path / "s"), "--comfyui-input", str(tmp_path / "no" / "input"),
            "--template", "face-swap-astronaut"]  # fmt: skip
    assert main(argv) == 2  # before computing anything
    assert not (tmp_path / "s").exists()
    assert "give ComfyUI's input folder" in capsys.readouterr().err


def test_unknown_example_template_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["examples", "--store", "/nonexistent", "--template", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
