"""The live bench's template store kept between runs: reused only when complete and for the same inputs."""

from __future__ import annotations

import argparse
import os
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

from sakura_tools.bench.cli_e2e import add_arguments
from sakura_tools.bench.cli_live import _cache_dir
from sakura_tools.bench.live_cache import COMPLETE, default_live_cache_dir, store_key, template_store


def _builder(calls: list):
    def build(folder: str) -> None:
        calls.append(folder)
        os.makedirs(os.path.join(folder, "shards"))
        Path(folder, "shards", "a").write_bytes(b"shard bytes")
        Path(folder, "manifest.json").write_text("{}")

    return build


def test_a_complete_store_is_built_once_and_served_as_a_copy(tmp_path):
    calls, cache = [], tmp_path / "cache"
    first = template_store("k1", {"x": 1}, _builder(calls), cache, str(tmp_path / "w1"), log=lambda m: None)
    said = []
    second = template_store("k1", {"x": 1}, _builder(calls), cache, str(tmp_path / "w2"), log=said.append)
    assert len(calls) == 1 and "cached" in said[0]
    assert Path(second, "shards", "a").read_bytes() == b"shard bytes"
    assert not Path(second, COMPLETE).exists() and Path(cache, "k1", COMPLETE).is_file()
    # a write into the served copy (the store writes by replacing a file) leaves the cache as it was
    tmp = Path(second, "shards", "a.tmp")
    tmp.write_bytes(b"new")
    os.replace(tmp, Path(second, "shards", "a"))
    assert Path(cache, "k1", "shards", "a").read_bytes() == b"shard bytes"
    assert Path(first, "manifest.json").read_text() == "{}"
    # another key builds its own
    template_store("k2", {"x": 2}, _builder(calls), cache, str(tmp_path / "w3"), log=lambda m: None)
    assert len(calls) == 2


def test_a_failed_build_leaves_nothing_and_the_next_run_builds_again(tmp_path):
    cache = tmp_path / "cache"

    def broken(folder: str) -> None:
        os.makedirs(folder)
        Path(folder, "half").write_bytes(b"x")
        raise RuntimeError("precompute failed")

    with pytest.raises(RuntimeError, match="precompute failed"):
        template_store("k", {}, broken, cache, str(tmp_path / "w1"), log=lambda m: None)
    assert list(cache.iterdir()) == []  # no entry, no temporary folder
    calls = []
    template_store("k", {}, _builder(calls), cache, str(tmp_path / "w2"), log=lambda m: None)
    assert len(calls) == 1


def test_an_incomplete_entry_is_rebuilt_not_served(tmp_path):
    cache = tmp_path / "cache"
    (cache / "k" / "shards").mkdir(parents=True)
    Path(cache, "k", "shards", "a").write_bytes(b"truncated")  # a killed run's leftover: no completion marker
    calls = []
    out = template_store("k", {}, _builder(calls), cache, str(tmp_path / "w"), log=lambda m: None)
    assert len(calls) == 1 and Path(out, "shards", "a").read_bytes() == b"shard bytes"


def test_without_a_cache_every_run_builds_into_its_work_folder(tmp_path):
    calls = []
    for i in range(2):
        out = template_store("k", {}, _builder(calls), None, str(tmp_path / f"w{i}"), log=lambda m: None)
        assert out.startswith(str(tmp_path / f"w{i}"))
    assert len(calls) == 2


def test_the_key_follows_every_input_and_only_them():
    from sakura_core.models.edit_model import ModelSpec, load_demo_model

    spec = ModelSpec.load(str(resources.files("sakura_tools.bench").joinpath("live_model.json")))
    a, b = (load_demo_model(spec, weights=None).adapter.model for _ in range(2))
    image = np.zeros((8, 8, 3), np.uint8)
    key = store_key(a, {"n": 1}, image, "per-step", 2, ("sakura",))[0]
    assert store_key(b, {"n": 1}, image.copy(), "per-step", 2, ("sakura",))[0] == key  # the seeded init again
    assert store_key(a, {"n": 1}, image, "per-step", 3, ("sakura",))[0] != key
    assert store_key(a, {"n": 1}, image, "single", 2, ("sakura",))[0] != key
    assert store_key(a, {"n": 2}, image, "per-step", 2, ("sakura",))[0] != key
    other = image.copy()
    other[0, 0, 0] = 1
    assert store_key(a, {"n": 1}, other, "per-step", 2, ("sakura",))[0] != key
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-3
    assert store_key(b, {"n": 1}, image, "per-step", 2, ("sakura",))[0] != key


def test_the_cli_flags_choose_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SAKURA_CACHE_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parse = parser.parse_args
    base = ["--mode", "live", "--json", str(tmp_path / "out.json")]
    assert _cache_dir(parse(base)) == default_live_cache_dir() == tmp_path / "live-bench"
    assert _cache_dir(parse([*base, "--live-cache", str(tmp_path / "c")])) == tmp_path / "c"
    assert _cache_dir(parse([*base, "--no-live-cache"])) is None


def test_only_the_stores_used_last_are_kept(tmp_path):
    cache, calls, said = tmp_path / "cache", [], []
    for i, key in enumerate(["k1", "k2", "k3"]):
        template_store(key, {}, _builder(calls), cache, str(tmp_path / f"w{i}"), log=said.append, keep=3)
        os.utime(cache / key / COMPLETE, (1000 + i, 1000 + i))  # made one after another
    template_store("k1", {}, _builder(calls), cache, str(tmp_path / "hit"), log=said.append, keep=3)  # used now
    (cache / "junk").mkdir()  # no completion marker: no store
    template_store("k4", {}, _builder(calls), cache, str(tmp_path / "w4"), log=said.append, keep=3)
    assert sorted(p.name for p in cache.iterdir()) == ["k1", "k3", "k4"]  # k2 was used least recently
    assert len(calls) == 4 and "removed 2 store(s)" in said[-1]


def test_a_store_cached_by_another_run_meanwhile_is_kept_and_served(tmp_path):
    cache, calls = tmp_path / "cache", []

    def racing(folder: str) -> None:  # while this run builds, another with the same key finishes first
        template_store("k", {}, _builder(calls), cache, str(tmp_path / "other"), log=lambda m: None)
        _builder(calls)(folder)
        Path(folder, "manifest.json").write_text('{"mine": true}')

    out = template_store("k", {}, racing, cache, str(tmp_path / "w"), log=lambda m: None)
    assert Path(cache, "k", "manifest.json").read_text() == "{}"  # the other run's store, untouched
    assert Path(out, "manifest.json").read_text() == "{}"
    assert [p.name for p in cache.iterdir()] == ["k"]  # this run's build removed
