"""What the live lanes and the simulator share of a run's settings and result: :class:`LaneConfig` (the lanes'
protocol settings, validated once; :class:`~sakura_core.runtime.pipeline_config.RuntimeConfig` and
:class:`~sakura_core.runtime.sim_types.SimConfig` are it plus their own) and :class:`LaneResult` (what both report
of a run; :class:`~sakura_core.runtime.pipeline_config.RunReport` and :class:`~sakura_core.runtime.sim_types.SimResult`
hold it as their ``result``, beside their own)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from .timeline import lane_busy_s

__all__ = ["LaneConfig", "LaneResult"]


@dataclass(frozen=True)
class LaneConfig:
    """The settings of the lanes' protocol, the same for a live run and a simulated one. Attributes:
    rtt_s: round trip charged per request in the policies' predictions (the simulator charges at least this, or
        twice the trace's one-way latency when that is more; mobile default 40 ms).
    upgrades: fetch progressive enhancements during later steps (policies that ask for them).
    latency_target_s: the user's latency target for the edit (seconds, > 0) or None; policies trade the slack
        under it for quality (sakura) or use it as their SLO (cachegen).
    prefetch_kv_bytes: per-step mode: the most decoded KV of later steps the device may hold (or receive) ahead of
        the step it runs (the phone agent sets it to the room its memory budget leaves): a fetch of a later step's
        shard waits until the KV of the later steps' shards requested so far leaves room for one more
        (:func:`~sakura_core.runtime.lane_rules.has_prefetch_room`; the running step's own shards never wait).
        None = no limit (the KV held is reported); 0 = no prefetch. The device then holds at most one step's KV
        plus this.
    request_ahead: the fetch lane sends its next request once the bytes requested and not yet received are within
        two round trips of the link (``deferral.ahead_window_bytes``): its round trip passes while those arrive, the
        transfers still one at a time on the wire, first in first out, decodes overlapping the transfers after
        them (live: with a fetcher that reports its chunks and awaits what ``on_chunk`` returns). The default.
        False: one request at a time, each once the transfer before has ended (its decode overlapping the next
        transfer), paying its round trip (``--requests sequential``).
    """

    rtt_s: float = 0.04
    upgrades: bool = True
    latency_target_s: float | None = None
    prefetch_kv_bytes: int | None = None
    request_ahead: bool = True

    def __post_init__(self) -> None:
        if self.prefetch_kv_bytes is not None and self.prefetch_kv_bytes < 0:
            raise ValueError(f"prefetch_kv_bytes must be >= 0 bytes or None (no limit), got {self.prefetch_kv_bytes}")
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            raise ValueError(f"latency_target_s must be > 0 seconds or None, got {self.latency_target_s}")
        if not self.rtt_s >= 0:
            raise ValueError(f"rtt_s must be >= 0 seconds, got {self.rtt_s}")


@dataclass
class LaneResult:
    """What a live run and a simulated one both report. Attributes:
    policy: the policy's name.
    latency_s: the edit's latency (seconds).
    bytes_fetched: bytes over the link (every transfer, upgrades and failed tries included).
    split_layer: step 0's split (the layer the template tokens dropped at; the layer count if they never did).
    split_layers: the split ``k_s`` of every step in per-step mode (``[split_layer]`` in single mode).
    events: the timeline: one dict per span (``lane``, ``start``, ``end``, ``layer``, ``level``).
    decisions: the decision log: one dict per decision (``t``, ``layer``, ``level``, ``reason``).
    peak_kv_bytes: the most decoded template KV held at once (fp16).
    """

    policy: str
    latency_s: float
    bytes_fetched: int
    split_layer: int
    _: KW_ONLY
    split_layers: list[int] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    peak_kv_bytes: int = 0

    def busy_s(self, lane: str) -> float:
        """Total time the lane was busy (overlaps merged)."""
        return lane_busy_s(self.events, lane)
