"""Hypothesis strategies for hostile manifests (issue 28): a valid manifest with random fields replaced by values of
other types, sizes and nesting (huge ints, NaN, deep lists, wrong shapes), keys removed, or the whole document a
nesting bomb. ``hostile_manifest_bytes(valid)`` draws the JSON bytes a hostile cloud or a broken store would hold.
``RssPeak`` measures the peak resident memory a fuzz adds (sampled by a thread, so a short-lived allocation counts)."""

from __future__ import annotations

import copy
import json
import os
import threading

import pytest
from hypothesis import strategies as st

__all__ = ["FUZZ_RSS_BOUND_BYTES", "RssPeak", "hostile_manifest_bytes", "json_values"]

#: The most resident memory a manifest fuzz may add to the process (its peak over the start): every size a manifest
#: names is bounded before anything is allocated, so what remains is hypothesis's and the parsers' own few MiB.
FUZZ_RSS_BOUND_BYTES = 64 << 20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssPeak:
    """``with RssPeak() as peak: ...``; then ``peak.growth_bytes``: the highest resident set size seen in the block
    (sampled every ``interval_s`` by a thread, and at both ends) minus the one at its start. Linux (/proc)."""

    def __init__(self, interval_s: float = 0.002):
        if not os.path.exists("/proc/self/statm"):
            pytest.skip("the RSS bound of the fuzz reads /proc/self/statm (Linux)")
        self.interval_s, self.start_bytes, self.peak_bytes = interval_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="rss-peak")

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    def __enter__(self) -> RssPeak:
        self.start_bytes = self.peak_bytes = _rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    @property
    def growth_bytes(self) -> int:
        return self.peak_bytes - self.start_bytes


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
    nested = st.recursive(
        _scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
        max_leaves=max_leaves,
    )
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
