"""Fixtures shared by the sakura_core tests."""

import pytest
import torch


@pytest.fixture(scope="session")
def demo_model():
    """The demo model with its seeded random init: tests must not depend on the trained weights."""
    from sakura_core.models.edit_model import load_demo_model

    torch.set_num_threads(1)
    return load_demo_model(weights=None)


@pytest.fixture(scope="session")
def demo_template(demo_model):
    from sakura_core.models.edit_model import load_image

    return load_image("astronaut", demo_model.spec.image_size)


@pytest.fixture(scope="session")
def demo_kv(demo_model, demo_template):
    return demo_model.adapter.extract_template_kv(demo_model.template_tokens(demo_template), demo_model.spec.grid)
