"""Hypothesis strategies for hostile manifests (issue 28): a valid manifest with random fields replaced by values of
other types, sizes and nesting (huge ints, NaN, deep lists, wrong shapes), keys removed, or the whole document a
nesting bomb. ``hostile_manifest_bytes(valid)`` draws the JSON bytes a hostile cloud or a broken store would hold."""

from __future__ import annotations

import copy
import json

from hypothesis import strategies as st

__all__ = ["hostile_manifest_bytes", "json_values"]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 255, 256, 257, 4095, 4096, 65536, 10**6, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["fp16", "sakura", "single", "per-step", "ab" * 32, ""]),
)


def json_values(max_leaves: int = 8):
    """Any JSON value: scalars, lists and objects (shallow), or a list nested up to 3000 deep."""
    nested = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                          max_leaves=max_leaves)  # fmt: skip
    deep = st.integers(1, 3000).map(lambda n: json.loads("[" * min(n, 900) + "]" * min(n, 900)))
    return st.one_of(nested, deep)


def _paths(value, prefix=()):
    """Every (path) into a JSON value, parents first."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value, delete: bool):
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value


@st.composite
def hostile_manifest_bytes(draw, valid: dict) -> bytes:
    """``valid`` with 1-3 random fields replaced or removed, as JSON bytes; sometimes a raw nesting bomb or junk."""
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "bomb", "junk"]))
    if kind == "bomb":
        depth = draw(st.integers(100, 200_000))
        return b'{"version": 1, "shards": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == "junk":
        return draw(st.binary(max_size=64))
    doc = copy.deepcopy(valid)
    paths = [p for p in _paths(doc) if p]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        try:
            _set(doc, path, draw(json_values()), delete=draw(st.booleans()))
        except (KeyError, IndexError, TypeError):  # a parent replaced by an earlier mutation
            continue
    return json.dumps(doc).encode()  # NaN / Infinity written as json.dumps does
