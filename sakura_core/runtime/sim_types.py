"""What one simulated edit takes and gives: :class:`SimConfig`, :class:`SimResult` (:mod:`.simulate` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PLANNING_MODES", "DiscardedEvents", "SimConfig", "SimResult"]

PLANNING_MODES = ("off", "measured", "fixed")


@dataclass(frozen=True)
class SimConfig:
    """Attributes:
    min_rtt_s: round trip charged per request when the trace has no latency (mobile default 40 ms).
    upgrades: allow progressive upgrades during later steps (policies that support them).
    latency_target_s: the user's latency target for the edit (seconds), or None.
    planning: what a policy's decisions cost the simulated phone: "off" (nothing), "measured" (each call's CPU
        time on this host, ``time.thread_time``, x the profile's ``cpu_slowdown``), or "fixed" (``planning_s``
        per call). A fetch decision delays its request, a compute-lane decision (``keep_template``,
        ``recompute_late``) the compute lane; on a profile whose DiT shares the CPU, planning on the link side also
        takes a core from it.
    planning_s: seconds per decision with ``planning="fixed"``.
    prefetch_kv_bytes: per-step mode: the most decoded KV of later steps the phone may hold, as the live pipeline's
        ``RuntimeConfig.prefetch_kv_bytes`` (the phone agent sets it to the room its memory budget leaves): a fetch
        of a later step's shard waits until the KV of the later steps' shards requested so far leaves room for one
        more (as the live lane counts; the running step's own shards never wait). None: not limited (the KV held is
        reported).
    request_ahead: the fetch lane sends its next request once the bytes requested and not yet received are within
        ``deferral.ahead_window_bytes`` (the live lane's ``RuntimeConfig.request_ahead``): its round trip passes while
        those arrive, and its bytes follow theirs (the wire carries one transfer at a time); the default, as the
        live lane's. False: each request leaves once the transfer before has arrived and pays its round trip.
    events: record the run's timeline (``SimResult.events``: one entry per fetch, decode, compute span and stall).
        False keeps none (the figures are the same): a bench keeps them only where it draws them, since a slow-link
        fetch-fp16 edit on the GPU profile logs ~10^6 waits (hundreds of MB a run).
    """

    min_rtt_s: float = 0.04
    upgrades: bool = True
    latency_target_s: float | None = None
    planning: str = "off"
    planning_s: float = 0.0
    prefetch_kv_bytes: int | None = None
    request_ahead: bool = True
    events: bool = True

    def __post_init__(self) -> None:
        if self.prefetch_kv_bytes is not None and self.prefetch_kv_bytes < 0:
            raise ValueError(f"prefetch_kv_bytes must be >= 0 bytes or None (no limit), got {self.prefetch_kv_bytes}")
        if self.planning not in PLANNING_MODES:
            raise ValueError(f"planning must be one of {', '.join(PLANNING_MODES)}, got {self.planning!r}")
        if self.planning_s < 0 or self.min_rtt_s < 0:
            raise ValueError(f"planning_s and min_rtt_s must be >= 0, got {self.planning_s}, {self.min_rtt_s}")


class DiscardedEvents(list):
    """The event log of a run that keeps none (``SimConfig.events`` False): every append is dropped."""

    def append(self, item) -> None:
        pass


@dataclass
class SimResult:
    policy: str
    trace: str
    start_s: float
    latency_s: float
    bytes_fetched: int
    psnr_db: float
    split_layer: int
    stall_s: float
    splits: list[int] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    peak_kv_bytes: int = 0  # the most decoded template KV held at once (fp16; what the live report's counts)
    planning_s: float = 0.0  # seconds of the phone's time charged for the policy's decisions
    decisions_timed: int = 0  # policy calls charged
    contention_s: float = 0.0  # seconds the DiT lost to decode / planning threads on its cores
