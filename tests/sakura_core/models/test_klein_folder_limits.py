"""A klein folder whose geometry the edit cannot take is refused at load with the setting, the folder's value and
the fix (issue 28): a text encoder shallower than ``text_encoder_layers`` (main: loaded, then an IndexError in
the prompt encoding), a VAE that downsamples less than klein's 8x (main: loaded; an edit at the default 512 px
then allocates tens of GB). Checked from the folder's configs before any weight is loaded, and again for a
pipeline built from single files."""

import json
import shutil

import pytest

from sakura_core.limits import MAX_EDIT_TOKENS, LimitError
from sakura_core.models.latent_model import check_pipeline_geometry, load_klein_folder


def _variant(klein_folder, tmp_path, spec: dict | None = None):
    folder = tmp_path / "variant-klein"
    shutil.copytree(klein_folder, folder)
    if spec is not None:
        (folder / "sakura_spec.json").write_text(json.dumps(spec))
    return folder


def test_a_shallow_text_encoder_is_refused_at_load(klein_folder, tmp_path):
    folder = _variant(klein_folder, tmp_path)
    cfg_path = folder / "text_encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_hidden_layers"] = 4  # its first 4 layers: a loadable, shallower encoder
    cfg.pop("layer_types", None)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        load_klein_folder(folder)
    msg = str(err.value)
    assert msg.startswith("variant-klein: text_encoder_layers [9, 18, 27] (sakura_spec.json; klein's default")
    assert "this folder's text encoder has 4 layers" in msg and 'set "text_encoder_layers"' in msg
    assert "within 0..4" in msg
    spec = json.loads((folder / "sakura_spec.json").read_text())
    (folder / "sakura_spec.json").write_text(json.dumps({**spec, "text_encoder_layers": [1, 2, 4]}))
    model = load_klein_folder(folder)  # the fix the message names works
    assert model.spec.text_encoder_layers == (1, 2, 4) and model.encode_prompt("a prompt").shape[0] == 1


def test_a_vae_that_downsamples_less_is_bounded_before_loading(klein_folder, tmp_path, monkeypatch):
    from diffusers import AutoencoderKLFlux2, Flux2KleinKVPipeline

    folder = _variant(klein_folder, tmp_path, {"text_tokens": 32, "name": "tiny"})  # image_size: the default 512
    shutil.rmtree(folder / "vae")
    AutoencoderKLFlux2(
        block_out_channels=(32, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=32,
    ).save_pretrained(folder / "vae")  # (downsamples 2x)

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded before the geometry was checked")

    monkeypatch.setattr(Flux2KleinKVPipeline, "from_pretrained", no_load)
    with pytest.raises(LimitError) as err:
        load_klein_folder(folder)
    msg = str(err.value)
    assert msg.startswith("variant-klein: an edit at image_size 512 is 128x128 = 16384 tokens with this folder's VAE")
    assert "downsamples 2x: 2 levels in vae/config.json block_out_channels" in msg
    assert f"over the limit of {MAX_EDIT_TOKENS}" in msg and 'set "image_size" <= 256' in msg
    monkeypatch.undo()
    (folder / "sakura_spec.json").write_text(json.dumps({"text_tokens": 32, "image_size": 256}))
    assert load_klein_folder(folder).spec.grid == (64, 64)  # the largest size the message names loads


def test_the_check_itself():
    check_pipeline_geometry("klein", {}, 4, 36)  # klein: 8x VAE at 512 px, a 36-layer Qwen3: fine
    check_pipeline_geometry("klein", {"image_size": 1024}, 4, 36)  # 64² = MAX_EDIT_TOKENS: fine
    with pytest.raises(LimitError, match="an edit at image_size 1040 is 65x65 = 4225 tokens"):
        check_pipeline_geometry("klein", {"image_size": 1040}, 4, 36)
    for layers in ([], [-1], [37], ["9"]):
        with pytest.raises(ValueError, match="must name hidden states 0..36"):
            check_pipeline_geometry("klein", {"text_encoder_layers": layers}, 4, 36)
