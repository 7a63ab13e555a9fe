"""What one simulated edit takes and gives: :class:`SimConfig`, :class:`SimResult` (:mod:`.simulate` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SimConfig", "SimResult"]


@dataclass(frozen=True)
class SimConfig:
    """Attributes:
    min_rtt_s: round trip charged per request when the trace has no latency (mobile default 40 ms).
    upgrades: allow progressive upgrades during later steps (policies that support them).
    latency_target_s: the user's latency target for the edit (seconds), or None.
    """

    min_rtt_s: float = 0.04
    upgrades: bool = True
    latency_target_s: float | None = None


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
