"""Sizes from outside are bounded before they are used (issue 28, point 1): the one JSON loader refuses nesting
bombs, NaN and oversize documents with a ValueError (never a RecursionError); a manifest's geometry, steps, shard
sizes, ladder, PSNRs and template image are bounded and typed by ``parse_manifest``; a shard blob whose header claims
another geometry than its manifest slot is refused before it is decompressed."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from sakura_core import limits
from sakura_core.kv import ShardBindingError, ShardInput, ShardMeta, ShardSlot
from sakura_core.kv.binding import check_shard_geometry
from sakura_core.kv.chain import ChainDecoder
from sakura_core.kv.codec_registry import get_codec
from sakura_core.kv.manifest import ManifestError, ManifestLimitError, parse_manifest
from sakura_core.limits import LimitError, bounded_json, json_depth

from ..synthetic_templates import build_synthetic

MODEL_ID = "ab" * 32
BOMB = b"[" * 100_000 + b"]" * 100_000


def test_a_nesting_bomb_is_a_limit_error_where_json_loads_recursed():
    with pytest.raises(RecursionError):
        json.loads(BOMB)  # the defect class: what every reader used to call
    with pytest.raises(LimitError, match="nested 100000 deep, over the limit of 64"):
        bounded_json(BOMB, "manifest")


def test_depth_is_counted_outside_strings_and_nan_and_size_are_refused():
    assert json_depth(b'{"a": [1, {"b": "[[[{{{\\"[["}], "c": []}') == 3  # brackets in strings do not count
    assert json_depth(b"7") == 0
    assert bounded_json(b'{"a": [[1]]}', "x", max_depth=3) == {"a": [[1]]}
    with pytest.raises(LimitError, match="nested 4 deep"):
        bounded_json(b'{"a": [[[1]]]}', "x", max_depth=3)
    with pytest.raises(ValueError, match="x: invalid JSON: NaN is not a JSON number"):
        bounded_json(b'{"psnr_db": NaN}', "x")
    with pytest.raises(LimitError, match="over the limit of 10"):
        bounded_json(b'{"a": "0123456789"}', "x", max_bytes=10)
    with pytest.raises(ValueError, match="invalid JSON"):
        bounded_json(b'\xff{"a"', "x")


def _manifest(**top) -> dict:
    m = copy.deepcopy(build_synthetic("tpl", model_id=MODEL_ID, num_layers=2).manifest)
    m.update(top)
    return m


@pytest.mark.parametrize(
    "top, says",
    [
        (dict(token_grid=[100_000, 100_000]), "'token_grid[0]' is 100000, over the limit of 256"),
        (dict(token_grid=[256, 257]), "'token_grid[1]' is 257"),
        (dict(heads=10**9), "'heads' is 1000000000, over the limit of 256"),
        (dict(head_dim=4096), "'head_dim' is 4096"),
        (dict(num_layers=10**6), "'num_layers' is 1000000"),
        (dict(token_grid=[256, 256], heads=128, head_dim=128), "K elements"),  # 2^31 elements in one shard
        (dict(template_image={"digest": "ab" * 32, "bytes": 4 << 30}), "'template_image.bytes' is 4294967296"),
    ],
)
def test_geometry_and_sizes_past_the_bounds_are_refused_naming_the_field(top, says):
    with pytest.raises(ManifestLimitError, match="over the limit") as info:
        parse_manifest(_manifest(**top))
    assert says in str(info.value)
    assert isinstance(info.value, ManifestError) and isinstance(info.value, LimitError)


def test_per_step_steps_are_bounded():
    m = _manifest(kv_mode="per-step")
    steps = limits.MAX_STEPS + 1
    m["schedule"] = {"steps": steps, "timesteps": [1.0] * steps, "shift": 1.0, "guidance": None}
    with pytest.raises(ManifestLimitError, match="'schedule.steps' is 1001, over the limit of 1000"):
        parse_manifest(m)


@pytest.mark.parametrize("psnr", ["31.2", math.nan, math.inf, True, [30]])
def test_a_psnr_must_be_a_finite_number(psnr):
    m = _manifest()
    m["shards"][1]["representations"][0]["psnr_db"] = psnr
    with pytest.raises(ManifestError, match=r"'shards\[1\].representations\[0\].psnr_db' must be a finite number"):
        parse_manifest(m)
    m["shards"][1]["representations"][0]["psnr_db"] = 31.25
    assert parse_manifest(m).shards[1].representations[0].psnr_db == 31.25


def test_every_shard_offers_the_same_ladder():
    m = _manifest()
    del m["shards"][1]["representations"][1]  # a level missing from one shard (its chain stays valid)
    with pytest.raises(ManifestError, match=r"'shards\[1\].representations' has the levels .* every shard must"):
        parse_manifest(m)


def test_too_many_representations_are_refused():
    m = _manifest()
    rep = m["shards"][0]["representations"][0]
    m["shards"][0]["representations"] = [
        {**rep, "level": i, "digest": f"{i:064x}", "name": f"l{i}"} for i in range(limits.MAX_REPRESENTATIONS + 1)
    ]
    with pytest.raises(ManifestLimitError, match=r"'shards\[0\].representations \(count\)' is 65"):
        parse_manifest(m)


def _sakura_chain(grid: tuple[int, int]) -> list[bytes]:
    rng = np.random.default_rng(3)
    shape = (1, grid[0] * grid[1], 2, 8)  # (layers, tokens, heads, head_dim)
    k, v = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)
    w = rng.exponential(size=shape).astype(np.float32)
    shard = ShardInput(k, v, ShardMeta(MODEL_ID, "tpl", "flux2-ref-t10", 0, grid, 6), k_weight=w, v_weight=w[..., 0])
    return get_codec("sakura").encode(shard, [0, 1])


def test_a_shard_of_another_grid_is_refused_before_it_is_decompressed(monkeypatch):
    import sakura_core.kv.chain as chain_mod

    chain = _sakura_chain((16, 16))
    slot = ShardSlot("tpl", MODEL_ID, (0, 0), "sakura", "sakura-l1", token_grid=(4, 4), heads=2, head_dim=8)
    steps = []
    real_get = chain_mod.get_codec
    monkeypatch.setattr(chain_mod, "get_codec", lambda name: _Spied(real_get(name), steps))
    dec = ChainDecoder()
    with pytest.raises(ShardBindingError, match=r"token grid \[16, 16\] \(expected \[4, 4\]\)"):
        dec.push(chain[0], lambda header: check_shard_geometry(header, slot))
    assert steps == []  # refused on its header: nothing was decompressed
    dec.push(chain[0])  # without the check the codec runs on it
    assert steps == [(16, 16)]


class _Spied:
    """A codec whose ``decode_step`` records the grid of each header it is given, then decodes."""

    def __init__(self, codec, steps: list):
        self._codec, self._steps = codec, steps

    def decode_step(self, state, header, sections):
        self._steps.append(header.token_grid)
        return self._codec.decode_step(state, header, sections)

    def __getattr__(self, name):
        return getattr(self._codec, name)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("heads", 4, "heads 2 (expected 4)"),
        ("head_dim", 16, "head_dim 8 (expected 16)"),
        ("token_grid", (4, 8), "token grid [4, 4] (expected [4, 8])"),
    ],
)
def test_geometry_mismatches_are_named(field, value, says):
    (blob, _) = _sakura_chain((4, 4))
    from sakura_core.kv.container import parse_shard

    header, _ = parse_shard(blob)
    fields = {**dict(token_grid=(4, 4), heads=2, head_dim=8), field: value}
    slot = ShardSlot("tpl", MODEL_ID, (0, 0), "sakura", "sakura-l0", **fields)
    with pytest.raises(ShardBindingError) as info:
        check_shard_geometry(header, slot)
    assert says in str(info.value)
    check_shard_geometry(header, ShardSlot("tpl", MODEL_ID, (0, 0), "sakura", "x", (4, 4), 2, 8))  # level aside
