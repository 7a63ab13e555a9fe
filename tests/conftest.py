"""Fixtures shared by every test package: a tiny random FLUX.2 [klein] KV pipeline folder (save_pretrained)."""

import pytest
from ci_deps import import_or_skip


@pytest.fixture(scope="session")
def klein_folder(tmp_path_factory):
    """A tiny random klein KV pipeline folder (64 px, 32 text tokens); skipped without transformers."""
    import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")
    import torch

    from sakura_core.models.tiny_klein import build_tiny_klein

    torch.set_num_threads(1)  # tiny models: threads only contend on a shared CI machine

    return build_tiny_klein(tmp_path_factory.mktemp("klein") / "tiny-klein")


@pytest.fixture(scope="session")
def klein_model(klein_folder):
    from sakura_core.models.latent_model import load_klein_folder

    return load_klein_folder(klein_folder)
