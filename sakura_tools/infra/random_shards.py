"""What the serving benchmarks (``sakura bench serve``, ``sakura bench catalog``) serve: seeded random shard blobs.
Bytes, not KV: what is measured is storing and serving, which never look inside a shard."""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["put_random_shards", "random_shards"]


def random_shards(layers: int, sizes: list[int], seed: int = 0) -> dict[str, bytes]:
    """``layers`` blobs of each size in ``sizes`` (bytes), seeded: digest -> blob, in creation order."""
    rng = np.random.default_rng(seed)
    blobs = {}
    for _ in range(layers):
        for nbytes in sizes:
            blob = rng.integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()
            blobs[hashlib.sha256(blob).hexdigest()] = blob
    return blobs


def put_random_shards(stores: list, layers: int, sizes: list[int], seed: int = 0) -> dict[str, bytes]:
    """:func:`random_shards`, stored as shards in every store of ``stores``; returns them."""
    blobs = random_shards(layers, sizes, seed)
    for store in stores:
        for digest, blob in blobs.items():
            store.put_shard(digest, blob)
    return blobs
