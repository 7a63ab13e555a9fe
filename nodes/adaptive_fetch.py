"""Sakura Bandwidth-Adaptive Fetch: policy + link settings for a template; starts the background prefetch and
outputs the ``SAKURA_KV_STREAM`` the sampler consumes (see ``_stream.KVStream``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from comfy_api.latest import io

from sakura_core.edit_settings import FetchSettings
from sakura_core.fetch.link import LinkSpec
from sakura_core.policy.plan import runnable_policies

from ._common import CATEGORY, SakuraKVStream, SakuraNodeError, SakuraTemplate
from ._stream import KVStream

__all__ = ["LIVE", "FIXED", "TRACE", "SakuraAdaptiveFetch", "bundled_traces"]

LIVE = "live"
FIXED = "fixed Mbit/s"
TRACE = "trace file"


def bundled_traces() -> dict[str, Path]:
    """The bandwidth traces shipped in ``sakura_core/fetch/traces`` by file name."""
    folder = resources.files("sakura_core.fetch").joinpath("traces")
    out = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_file() and not entry.name.startswith(".") and not entry.name.endswith((".md", ".txt", ".py")):
            out[entry.name] = Path(str(entry))
    return out


class SakuraAdaptiveFetch(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        traces = list(bundled_traces())
        return io.Schema(
            node_id="SakuraAdaptiveFetch",
            display_name="Sakura Bandwidth-Adaptive Fetch",
            category=CATEGORY,
            description="Chooses how the template's KV reaches the device: a fetch policy and the link it runs over "
            "(live, a fixed emulated rate, or a recorded trace). Starts prefetching in the background, so the "
            "transfer overlaps the rest of the graph; the sampler streams the shards the policy picks.",
            inputs=[
                SakuraTemplate.Input("template", tooltip="The template from a Sakura Template KV Loader."),
                io.Combo.Input(
                    "policy",
                    options=runnable_policies(),
                    default="sakura",
                    tooltip="sakura = adaptive (hybrid split, per-shard levels, upgrades); on-device / "
                    "on-device-cached compute the template here; fetch-fp16, cachegen, throughput are baselines; "
                    "oracle reads the (emulated) trace ahead.",
                ),
                io.Combo.Input(
                    "bandwidth",
                    options=[LIVE, FIXED, TRACE],
                    default=LIVE,
                    tooltip="The link the shards come over: 'live' = the real network as it is (fixed_mbit_s and "
                    "trace are not used); 'fixed Mbit/s' = emulated at fixed_mbit_s; 'trace file' = emulated by a "
                    "recorded mobile trace (trace, or trace_path).",
                ),
                io.Float.Input(
                    "fixed_mbit_s",
                    default=20.0,
                    min=0.05,
                    max=10000.0,
                    step=0.05,
                    tooltip="Emulated link rate (bandwidth = 'fixed Mbit/s' only).",
                ),
                io.Combo.Input(
                    "trace",
                    options=traces,
                    default=traces[0] if traces else None,
                    tooltip="A bundled mobile bandwidth trace (bandwidth = 'trace file' only), replayed from its start.",
                ),
                io.String.Input(
                    "trace_path",
                    default="",
                    tooltip="A trace file (Pensieve, Sabre JSON or Mahimahi) to use instead of the bundled one.",
                ),
                io.Float.Input(
                    "latency_target_s",
                    default=0.0,
                    min=0.0,
                    max=3600.0,
                    step=0.1,
                    optional=True,
                    tooltip="Latency target for the edit in seconds (0 = none). sakura spends the predicted slack "
                    "under it on better shard levels; cachegen uses it as its SLO.",
                ),
            ],
            outputs=[
                SakuraKVStream.Output(
                    "kv_stream",
                    display_name="SAKURA_KV_STREAM",
                    tooltip="The template's KV as it streams in (prefetch already started); into the sampler.",
                )
            ],
        )

    @classmethod
    def execute(
        cls,
        template,
        policy: str,
        bandwidth: str,
        fixed_mbit_s: float,
        trace: str,
        trace_path: str,
        latency_target_s: float | None = None,
    ) -> io.NodeOutput:
        if bandwidth not in (LIVE, FIXED, TRACE):
            raise SakuraNodeError(f"bandwidth must be one of {LIVE!r}, {FIXED!r}, {TRACE!r}; got {bandwidth!r}")
        path = None
        if bandwidth == TRACE:
            path = Path(trace_path.strip()).expanduser() if trace_path.strip() else bundled_traces().get(trace)
            if path is None:
                raise SakuraNodeError(f"unknown bundled trace {trace!r}; choose one of {', '.join(bundled_traces())}")
        try:
            settings = FetchSettings(
                policy=policy,
                link=_link(bandwidth, fixed_mbit_s, path),
                latency_target_s=latency_target_s if latency_target_s else None,
            )
        except ValueError as e:  # includes TraceFormatError (unreadable or unknown trace file)
            raise SakuraNodeError(f"fetch settings: {e}") from e
        stream = KVStream(template, settings)
        stream.start()
        return io.NodeOutput(stream)


def _link(bandwidth: str, fixed_mbit_s: float, trace_path: Path | None) -> LinkSpec:
    """The node's link as a ``LinkSpec`` (built, not formatted to a string and parsed again); a fixed rate keeps the
    widget's value to 6 significant digits, as its string form always did. A bad rate or an unreadable trace file
    raises ``ValueError`` naming it."""
    if bandwidth == FIXED:
        return LinkSpec.fixed(float(f"{fixed_mbit_s:g}"))
    if bandwidth == TRACE and trace_path is not None:
        return LinkSpec.trace_file(str(trace_path))
    return LinkSpec.live()
