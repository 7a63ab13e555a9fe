"""The Template KV Loader against hostile manifests in a local store (issue 28): a nesting bomb, non-finite or
non-numeric values, a grid past the bounds, malformed references — each a SakuraNodeError that says what is wrong,
never a raw TypeError / RecursionError; and a hypothesis fuzz of manifests: 0 exceptions of other classes."""

from __future__ import annotations

import copy
import json
import logging
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings

from cloud_server.store import LocalStore

from ..manifest_fuzz import FUZZ_RSS_BOUND_BYTES, RssPeak, hostile_manifest_bytes
from ..synthetic_templates import build_synthetic

TID = "tpl-hostile"


def _valid(model) -> dict:
    a = model.adapter
    m = build_synthetic(TID, model_id=model.model_id, num_layers=a.num_layers).manifest
    m.update(
        token_grid=list(model.spec.grid),
        heads=a.num_heads,
        head_dim=a.head_dim,
        template_image={"digest": "ab" * 32, "bytes": 1000},
    )
    return m


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory, demo_model):
    store = LocalStore(tmp_path_factory.mktemp("hostile-store"))
    store.put_manifest(TID, _valid(demo_model))
    return store


def _load(flow, model, store, body: bytes):
    (store.template_dir(TID) / "manifest.json").write_bytes(body)
    return flow.load_template(model, source="local store", store_dir=str(store.root), template_id=TID)


def test_a_valid_manifest_loads(flow, demo_model, hostile_store):
    template = _load(flow, demo_model, hostile_store, json.dumps(_valid(demo_model)).encode())
    assert template.manifest.token_grid == tuple(demo_model.spec.grid)


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda m: "[" * 100_000 + "]" * 100_000, "nested 100000 deep, over the limit of 64"),
        (lambda m: {**m, "heads": float("nan")}, "invalid JSON: NaN is not a JSON number"),
        (lambda m: {**m, "token_grid": [100_000, 100_000]}, r"'token_grid\[0\]' is 100000, over the limit of 256"),
        (lambda m: {**m, "heads": m["heads"] * 2}, r"\(layers, heads, head_dim\)"),
        (lambda m: {**m, "references": "abc"}, "'references' must list the 1 reference"),
        (lambda m: {**m, "references": [1, None, {"tokens": [1]}]}, "'references' must list the 1 reference"),
    ],
)
def test_hostile_manifests_are_readable_node_errors(comfy, flow, demo_model, hostile_store, change, says):
    changed = change(copy.deepcopy(_valid(demo_model)))
    body = changed.encode() if isinstance(changed, str) else json.dumps(changed).encode()
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match=says):
        _load(flow, demo_model, hostile_store, body)


_FUZZ = settings(
    max_examples=120,
    deadline=timedelta(seconds=20),
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def valid_manifest(demo_model):
    return _valid(demo_model)


def test_fuzzed_manifests_raise_only_the_nodes_error(comfy, flow, demo_model, hostile_store, valid_manifest):
    err = comfy.nodes._common.SakuraNodeError
    outcomes = {"loaded": 0, "refused": 0}

    @_FUZZ
    @given(body=hostile_manifest_bytes(valid_manifest))
    def run(body):
        try:
            _load(flow, demo_model, hostile_store, body)
            outcomes["loaded"] += 1
        except err:
            outcomes["refused"] += 1

    with RssPeak() as rss:
        run()
    assert outcomes["refused"] > 0
    logging.getLogger(__name__).info(f"loader fuzz: peak RSS growth {rss.growth_bytes / 2**20:.1f} MiB")
    assert rss.growth_bytes < FUZZ_RSS_BOUND_BYTES, f"peak RSS grew {rss.growth_bytes / 2**20:.1f} MiB"
