"""Fixtures shared by the sakura_core tests."""

import pytest
import torch


@pytest.fixture(scope="session")
def demo_model():
    """The demo model with its seeded random init: tests must not depend on the trained weights."""
    from sakura_core.models.demo import load_demo_model

    torch.set_num_threads(1)
    return load_demo_model(weights=None)
