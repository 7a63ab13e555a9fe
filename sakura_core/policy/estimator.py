"""Throughput estimation from completed transfers (RobustMPC-style, Yin et al. SIGCOMM'15)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["EstimatorConfig", "ThroughputEstimator"]


@dataclass(frozen=True)
class EstimatorConfig:
    """Attributes:
    window: samples in the harmonic mean (RobustMPC: 5).
    min_sample_bytes: a transfer smaller than this is no sample on its own (latency-dominated): consecutive small
        transfers are pooled (their bytes over their summed time) until they reach it, so a run of small shards
        still moves the estimate off the prior.
    prior_bytes_per_s: estimate before any sample (conservative: 0.5 Mbit/s).
    seed_rtt_share: the most of a pre-lane transfer's time :meth:`ThroughputEstimator.seed` takes for its round
        trip (0.5: a seed is at most twice its raw bytes over seconds).
    """

    window: int = 5
    min_sample_bytes: int = 16 * 1024
    prior_bytes_per_s: float = 0.5e6 / 8
    seed_rtt_share: float = 0.5

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.prior_bytes_per_s <= 0:
            raise ValueError(f"prior_bytes_per_s must be > 0, got {self.prior_bytes_per_s}")
        if not 0.0 <= self.seed_rtt_share < 1.0:
            raise ValueError(f"seed_rtt_share must be in [0, 1), got {self.seed_rtt_share}")


class ThroughputEstimator:
    """``observe(nbytes, seconds)`` per transfer (``seed(...)`` for one made before the lanes); ``harmonic()`` and the error-discounted ``robust()`` estimates."""

    def __init__(self, config: EstimatorConfig | None = None):
        self.config = config or EstimatorConfig()
        self.reset()

    def reset(self) -> None:
        self._samples: deque[float] = deque(maxlen=self.config.window)
        self._errors: deque[float] = deque(maxlen=self.config.window)
        self._last_prediction: float | None = None
        self._pooled = (0.0, 0.0)  # small transfers not yet a sample: bytes, seconds

    @property
    def samples(self) -> int:
        return len(self._samples)

    def observe(self, nbytes: float, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        if nbytes < self.config.min_sample_bytes:
            nbytes, seconds = self._pooled[0] + nbytes, self._pooled[1] + seconds
            if nbytes < self.config.min_sample_bytes:
                self._pooled = (nbytes, seconds)
                return
        self._take(nbytes, seconds)

    def _take(self, nbytes: float, seconds: float) -> None:
        """``nbytes`` over ``seconds`` as a sample (what was pooled is in it or given up)."""
        self._pooled = (0.0, 0.0)
        rate = nbytes / seconds
        if self._last_prediction is not None:
            self._errors.append(abs(self._last_prediction - rate) / rate)
        self._samples.append(rate)
        self._last_prediction = self.harmonic()

    def seed(self, nbytes: float, seconds: float, rtt_s: float) -> None:
        """A transfer made before the lanes start (the manifest, the template image: one request each, alone on the
        link) as a sample, so the first plan is made on the link rather than on the prior. Its ``seconds`` (request
        to last byte) include the round trip ``rtt_s`` before its first byte, which the lanes' samples do not
        count as throughput: it is taken off, but at most ``seed_rtt_share`` of the time, since a transfer of a
        round trip or two is latency more than bytes (TCP's slow start, the round trip's own error) and its bytes
        over what is left would overstate the link. So a seed is at most 1 / (1 - seed_rtt_share) times its raw
        rate. A seed is a sample of its own whatever its size (with what small transfers were pooled before it):
        unlike a lane's small shard, whose time is mostly the round trip, its round trip is measured and taken off,
        and a small one reads the link low (a transfer within its slow start), which keeps the first plan cautious
        rather than leaving it on the prior. As a sample, the first lane sample's error against it counts in
        :meth:`robust` (a seed that misjudged the link makes the estimate more cautious, as any other sample's
        does)."""
        if nbytes <= 0 or seconds <= 0:
            return
        rtt = min(max(rtt_s, 0.0), self.config.seed_rtt_share * seconds)
        self._take(self._pooled[0] + nbytes, self._pooled[1] + seconds - rtt)

    def harmonic(self) -> float:
        """Harmonic mean of the recent samples in bytes/s (the prior before any sample)."""
        if not self._samples:
            return self.config.prior_bytes_per_s
        return len(self._samples) / sum(1.0 / s for s in self._samples)

    def robust(self) -> float:
        """Harmonic mean divided by (1 + max recent relative prediction error): RobustMPC's conservative estimate."""
        err = max(self._errors) if self._errors else 0.0
        return self.harmonic() / (1.0 + err)

    def worst(self) -> float:
        """The lower of ``robust()`` and the slowest recent sample: for irreversible decisions."""
        if not self._samples:
            return self.config.prior_bytes_per_s
        return min(self.robust(), min(self._samples))
