"""What one simulated edit takes and gives: :class:`SimConfig`, :class:`SimResult` (:mod:`.simulate` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .lane_types import LaneConfig, LaneResult

__all__ = ["PLANNING_MODES", "CpuCharges", "DiscardedEvents", "SimConfig", "SimResult"]

PLANNING_MODES = ("off", "measured", "fixed")


@dataclass(frozen=True)
class SimConfig(LaneConfig):
    """The lanes' settings (:class:`~sakura_core.runtime.lane_types.LaneConfig`: ``rtt_s`` is the least round trip
    charged per request, twice the trace's one-way latency when that is more) and the simulator's own. Attributes:
    planning: what a policy's decisions cost the simulated phone: "off" (nothing), "measured" (each call's CPU
        time on this host, ``time.thread_time``, x the profile's ``cpu_slowdown``), or "fixed" (``planning_s``
        per call). A fetch decision delays its request, a compute-lane decision (``keep_template``,
        ``recompute_late``) the compute lane; on a profile whose DiT shares the CPU, planning on the link side also
        takes a core from it.
    planning_s: seconds per decision with ``planning="fixed"``.
    events: record the run's timeline (``SimResult.result.events``: one entry per fetch, decode, compute span and
        stall). False keeps none (the figures are the same): a bench keeps them only where it draws them, since a
        slow-link fetch-fp16 edit on the GPU profile logs ~10^6 waits (hundreds of MB a run).
    """

    planning: str = "off"
    planning_s: float = 0.0
    events: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.planning not in PLANNING_MODES:
            raise ValueError(f"planning must be one of {', '.join(PLANNING_MODES)}, got {self.planning!r}")
        if self.planning_s < 0:
            raise ValueError(f"planning_s must be >= 0, got {self.planning_s}")


class DiscardedEvents(list):
    """The event log of a run that keeps none (``SimConfig.events`` False): every append is dropped."""

    def append(self, item) -> None:
        pass


@dataclass(frozen=True)
class CpuCharges:
    """What a simulated run charged the phone's CPU besides the DiT's own compute. Attributes:
    planning_s: seconds of the phone's time charged for the policy's decisions (``SimConfig.planning``).
    decisions_timed: policy calls charged.
    contention_s: seconds the DiT lost to decode / planning threads on its cores.
    """

    planning_s: float = 0.0
    decisions_timed: int = 0
    contention_s: float = 0.0


@dataclass
class SimResult:
    """A simulated run: ``result``, what a live one reports too (:class:`~sakura_core.runtime.lane_types.LaneResult`),
    and the simulator's own figures: the ``trace`` and the ``start_s`` in it the edit began at, the output's
    ``psnr_db``, the compute lane's ``stall_s`` (seconds waiting for KV), what it charged the ``cpu`` and the ``pre_lanes_s`` before
    the lanes started."""

    result: LaneResult
    trace: str
    start_s: float
    psnr_db: float
    stall_s: float
    cpu: CpuCharges = field(default_factory=CpuCharges)
    pre_lanes_s: float = 0.0  # seconds before the lanes started (the template image; in the result's latency_s)

    @property
    def splits(self) -> list[int]:
        """The split of every step (``result.split_layers``; ``[split_layer]`` in single mode)."""
        return self.result.split_layers
