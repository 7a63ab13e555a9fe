"""What a simulated run reports (:class:`SimOutcome`, a mixin of the simulator's ``_Sim``): the shared
:class:`~sakura_core.runtime.lane_types.LaneResult` and the simulator's own figures, the output's quality from the
levels each shard ran with (on its closed-loop track or off it) and the most decoded KV held at once."""

from __future__ import annotations

from ..metrics import psnr_from_mse
from .lane_types import LaneResult
from .sim_cpu import CpuShare
from .sim_link import SimLink
from .sim_types import CpuCharges, SimResult

__all__ = ["SimOutcome"]


class SimOutcome(SimLink, CpuShare):
    """The simulator's link and CPU state with the run's result read from them (the simulator's ``_Sim`` extends it
    with the compute lane)."""

    # the compute lane's record these read (set by the simulator's ``_Sim``)
    used: dict[int, list[int]]  # shard -> the level it ran with at each use
    splits: list[int]
    split_layer: int
    stall_s: float
    pre_lanes_s: float  # seconds before the lanes (the template image), in the latency
    _start0: float  # where in the trace the edit began
    passed: dict[int, float]  # shard -> when the compute lane went past it (per-step mode)

    def _result(self) -> SimResult:
        self.settle_contention()  # the threads that overlapped the last layer (no new transfer after the edit)
        mse = 0.0
        for layer, levels in self.used.items():
            for j in levels:
                mse += self._mse_share(layer, j) / len(levels)
        result = LaneResult(
            policy=self.policy.name,
            latency_s=self.pre_lanes_s + self.compute_t + self.profile.fixed_s,
            bytes_fetched=self.bytes,
            split_layer=self.split_layer,
            split_layers=list(self.splits),
            events=self.events,
            decisions=self.decisions,
            peak_kv_bytes=self._peak_kv_bytes(),
        )
        return SimResult(
            result,
            trace=self.trace.name,
            start_s=self._start0,
            psnr_db=psnr_from_mse(mse),
            stall_s=self.stall_s,
            cpu=CpuCharges(self.policy.total_s, self.policy.calls, self.contention_s),
            pre_lanes_s=self.pre_lanes_s,
        )

    def _mse_share(self, g: int, j: int) -> float:
        """Shard ``g``'s share of the output MSE at level ``j``: its closed-loop track's (the twin's share, measured
        with step 0 at the level and every later step its twin) when it is on that track — a twin, or the step-0
        level whose next step's twin was fetched against it — else the level's own (open loop)."""
        lv = self.ladders[g][j]
        if (g, j) in self.twins:
            return lv.fetched(True).mse
        nxt = g + self.L
        if self.per_step and g < self.L and nxt < self.N:  # by name: a reuse rung in front shifts later ladders
            twin = next(
                (i for i, x in enumerate(self.ladders[nxt]) if x.name == lv.name and (nxt, i) in self.twins), None
            )
            if twin is not None:
                return self.ladders[nxt][twin].fetched(True).mse
        return lv.mse

    def _peak_kv_bytes(self) -> int:
        """The most decoded template KV held at once, as the live pipeline counts it: a fetched shard from its first
        decode, a fallback pass's KV from the pass, until the compute lane is past the shard (per-step mode) or the
        edit ends (single mode: every step uses it); one shard's K and V in fp16."""
        end = self.compute_t
        spans = [(min(t for _, t in got), g) for g, got in self._got.items()]
        spans += [(t, g) for g, t in self.device_kv_at.items()]
        edges = []
        for t0, g in spans:
            t1 = self.passed.get(g, end) if self.per_step else end
            if t0 < t1:
                edges += [(t0, 1), (t1, -1)]
        held = peak = 0
        for _, d in sorted(edges):  # at one time a release (-1) comes before a hold (+1)
            held += d
            peak = max(peak, held)
        shard = getattr(self.profile.model, "shard_bytes_fp16", None)
        if shard is None:  # a measured live profile has no geometry: the ladder's fp16 level, if it has one
            shard = next((lv.nbytes for lv in self.ladders[0] if lv.name == "fp16"), 0) if self.ladders else 0
        return peak * int(shard)
