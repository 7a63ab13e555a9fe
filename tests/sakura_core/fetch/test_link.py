"""LinkSpec: the link's string form is parsed once, round-trips, reads a trace file once, and names the fix on
bad values."""

from __future__ import annotations

from importlib import resources

import pytest

from sakura_core.fetch import link as link_mod
from sakura_core.fetch.link import LinkSpec
from sakura_core.fetch.traces import TraceFormatError

BUNDLED = str(resources.files("sakura_core.fetch").joinpath("traces", "norway_bus_1"))


@pytest.mark.parametrize("spec", [None, "", "live", " live "])
def test_live(spec):
    link = LinkSpec.parse(spec)
    assert link == LinkSpec.live() and link.kind == "live" and not link.emulated
    assert link.trace() is None and link.to_wire() == "live" and str(link) == "live"


def test_fixed_is_a_constant_trace_of_that_rate():
    link = LinkSpec.parse("fixed:20")
    assert link == LinkSpec.fixed(20.0) and link.mbit_s == 20.0 and link.emulated
    assert link.trace().rate_at(0.0) == 20e6 / 8  # bytes/s
    assert link.to_wire() == "fixed:20" and LinkSpec.parse(link.to_wire()) == link
    assert LinkSpec.parse("fixed:0.5").to_wire() == "fixed:0.5" and link.label == "fixed 20 Mbit/s"


def test_trace_file_is_read_once_and_named_by_basename(monkeypatch):
    reads = []
    real = link_mod.load_trace
    monkeypatch.setattr(link_mod, "load_trace", lambda p: reads.append(p) or real(p))
    link = LinkSpec.parse(f"trace:{BUNDLED}")
    assert reads == [BUNDLED]
    assert link.trace() is link.trace() and link.trace().name == "norway_bus_1"
    assert reads == [BUNDLED]  # the spec holds the trace; using it reads nothing again
    assert link.to_wire() == f"trace:{BUNDLED}" and LinkSpec.parse(link.to_wire()) == link
    assert link.label == "trace norway_bus_1"  # titles and summaries carry no absolute path
    assert LinkSpec.parse(link) is link


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("fixed:fast", r"'fixed:fast': 'fast' is not a number of Mbit/s; write e.g. fixed:20"),
        ("fixed:0", r"fixed link rate 0.0 Mbit/s must be > 0"),
        ("fixed:-3", r"must be > 0"),
        ("fixed:nan", r"must be > 0 and finite"),
        ("fixed", r"link 'fixed' is not understood; write 'live', 'fixed:<Mbit/s>'"),
        ("trace:", r"link 'trace:' names no file"),
        ("5g", r"link '5g' is not understood; write 'live', 'fixed:<Mbit/s>' \(e.g. fixed:20\) or 'trace:"),
        (20, r"link 20 is a int; write 'live'"),
    ],
)
def test_bad_values_name_the_value_and_the_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        LinkSpec.parse(spec)


def test_a_missing_trace_file_names_the_file(tmp_path):
    with pytest.raises(TraceFormatError, match="nope.trace"):
        LinkSpec.parse(f"trace:{tmp_path / 'nope.trace'}")


def test_direct_construction_is_validated():
    with pytest.raises(ValueError, match="link kind 'dsl' is not one of live, fixed, trace"):
        LinkSpec("dsl")
    with pytest.raises(ValueError, match="a live link takes no rate or path"):
        LinkSpec("live", mbit_s=3.0)
    with pytest.raises(ValueError, match="a fixed link needs mbit_s"):
        LinkSpec("fixed")


def test_the_shaped_fetcher_reports_each_chunk_to_the_pipeline():
    """``on_chunk`` reaches the client (paced or not), so the pipeline sees a transfer while it lasts."""
    import asyncio

    from sakura_core.fetch.link import shaped_fetcher
    from sakura_core.runtime.fetch_lane import takes_on_chunk

    class Client:
        async def fetch_shard(self, digest, *, expected_bytes=None, on_chunk=None, throttle=None):
            for n in (3, 4):
                if throttle is not None:
                    await throttle(n)
                if on_chunk is not None:
                    on_chunk(n)
            return b"x" * 7

    for link in (None, LinkSpec.fixed(1000.0)):
        fetch = shaped_fetcher(Client(), link)
        seen = []
        assert takes_on_chunk(fetch)
        assert asyncio.run(fetch("d", 7, on_chunk=seen.append)) == b"x" * 7 and seen == [3, 4]
        assert asyncio.run(fetch("d", 7)) == b"x" * 7  # without a hook too
    assert not takes_on_chunk(lambda digest, nbytes: None)
