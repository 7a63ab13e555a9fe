"""A shard's header must match the manifest slot it fills (template, model, layers, codec, level): issue 15 point 2."""

import pytest
from typed_manifests import unchecked_manifest

from sakura_core.kv import (
    ShardBindingError,
    ShardCorruptError,
    ShardHeader,
    ShardSlot,
    check_shard_binding,
    slot_from_manifest,
)

MODEL_ID = "ab" * 32


def _header(**overrides) -> ShardHeader:
    fields = dict(
        codec="sakura",
        level=2,
        model_id=MODEL_ID,
        template_id="tmpl",
        rope_layout="r",
        layer_first=3,
        layer_last=3,
        token_grid=(8, 8),
        heads=2,
        head_dim=16,
    )
    fields.update(overrides)
    return ShardHeader(**fields)


SLOT = ShardSlot("tmpl", MODEL_ID, (3, 3), "sakura", "sakura-l2")


def test_a_matching_header_passes():
    check_shard_binding(_header(), SLOT)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (dict(layer_first=4, layer_last=4), "layers 4-4 (expected 3-3)"),  # two layers' digests swapped
        (dict(template_id="other"), "template 'other' (expected 'tmpl')"),  # another template's shard
        (dict(model_id="cd" * 32), "model cdcdcdcdcdcd… (expected abababababab…)"),
        (dict(level=1), "level 'sakura-l1' (expected 'sakura-l2')"),  # two levels swapped
        (dict(codec="fp16", level=0), "codec 'fp16' (expected 'sakura')"),
    ],
)
def test_each_mismatch_is_named_and_is_a_corrupt_shard(overrides, says):
    with pytest.raises(ShardBindingError, match="tampered with or mixed up") as info:
        check_shard_binding(_header(**overrides), SLOT)
    assert says in str(info.value)
    assert isinstance(info.value, ShardCorruptError)  # callers' corrupt-shard fallback applies


def test_slot_from_manifest_uses_the_representation_and_its_shard_entry():
    fp16 = {"name": "fp16", "codec": "fp16", "level": 0, "bytes": 8, "digest": "d"}
    manifest = unchecked_manifest(
        {
            "template_id": "tmpl",
            "model_id": MODEL_ID,
            "codec": "sakura",
            "token_grid": [1, 2],
            "heads": 3,
            "head_dim": 4,
            "shards": [{"layers": [0, 1], "representations": [fp16]}, {"layers": [2, 3], "representations": [fp16]}],
        }
    )
    rep = manifest.shards[1].representations[0]
    slot = slot_from_manifest(manifest, 3, rep)
    assert slot == ShardSlot("tmpl", MODEL_ID, (2, 3), "fp16", "fp16", token_grid=(1, 2), heads=3, head_dim=4)
    with pytest.raises(ValueError, match="no shard holding layer 9"):
        slot_from_manifest(manifest, 9, rep)
