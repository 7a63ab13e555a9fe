"""The single-mode ladders refuse a per-step manifest instead of mixing the KV of different steps."""

import pytest

from sakura_core.policy import ladders_from_manifest


def test_per_step_manifest_is_refused_with_the_fix():
    manifest = {"template_id": "t", "kv_mode": "per-step", "num_layers": 1, "shards": []}
    with pytest.raises(ValueError, match="'per-step' KV.*shards_for_step"):
        ladders_from_manifest(manifest, 1e9)
