"""Shared fixtures for the KV codec tests: seeded synthetic shards and the demo model with its random init."""

import numpy as np
import pytest

from sakura_core.kv import ShardInput, ShardMeta

MODEL_ID = "ab" * 32


def _make_shard(
    layers: int = 1,
    grid: tuple[int, int] = (8, 8),
    heads: int = 2,
    head_dim: int = 16,
    seed: int = 0,
    weights: bool = True,
    layer_first: int = 0,
    num_model_layers: int = 6,
) -> ShardInput:
    """Seeded Gaussian K/V with a few outlier channels and tokens, and exponential importance weights."""
    rng = np.random.default_rng(seed)
    tokens = grid[0] * grid[1]
    shape = (layers, tokens, heads, head_dim)
    k = rng.standard_normal(shape, dtype=np.float32)
    k[..., 0] *= 4.0  # an outlier channel, as trained keys have
    v = (0.6 * rng.standard_normal(shape)).astype(np.float32)
    v[:, 3] *= 5.0  # an outlier token
    meta = ShardMeta(MODEL_ID, "tmpl", "flux2-ref-t10", layer_first, grid, num_model_layers)
    if not weights:
        return ShardInput(k, v, meta)
    kw = rng.exponential(size=shape).astype(np.float32)
    vw = rng.exponential(size=shape[:3]).astype(np.float32)
    kd = 2.0 * (kw * (k - k.mean(1, keepdims=True)) ** 2).sum(-1)  # dropping a key costs more than first order says
    return ShardInput(k, v, meta, k_weight=kw, v_weight=vw, k_drop=kd)


@pytest.fixture
def make_shard():
    """Factory fixture: ``make_shard(seed=..., grid=..., ...)`` -> a seeded synthetic :class:`ShardInput`."""
    return _make_shard


@pytest.fixture
def shard() -> ShardInput:
    return _make_shard()
