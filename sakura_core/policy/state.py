"""What a fetch policy's :class:`~sakura_core.policy.context.Context` reads: the :class:`PolicyState` protocol the
simulator's state and the live pipeline's (:class:`~sakura_core.runtime.live_state.LiveState`) implement, and the
device costs (:class:`ComputeCosts`) a profile provides. Times are seconds since the edit started, sizes bytes."""

from __future__ import annotations

from typing import Protocol

from ..fetch.traces import Trace
from .estimator import ThroughputEstimator
from .ladder import Level

__all__ = ["ComputeCosts", "PolicyState"]


class _Steps(Protocol):
    @property
    def steps(self) -> int: ...  # read-only: a frozen profile's model provides it


class ComputeCosts(Protocol):
    """What a policy reads of the device (``sakura_core.runtime.profiles.DeviceProfile`` and the live pipeline's
    measured profile both provide it). All times in seconds on that device."""

    @property
    def layer_full_s(self) -> float: ...  # one layer that also runs the template tokens

    @property
    def layer_cached_s(self) -> float: ...  # one layer with the template's KV injected

    @property
    def template_pass_s(self) -> float: ...  # the template tokens alone through every layer

    @property
    def fixed_s(self) -> float: ...  # per-edit work outside the DiT

    @property
    def model(self) -> _Steps: ...  # ``.steps``: denoising steps


class PolicyState(Protocol):
    """The state a :class:`Context` reads: the simulator (``runtime.simulate``) and the live pipeline
    (:class:`~sakura_core.runtime.live_state.LiveState`) both keep it. Policies only read it, through :class:`Context`.

    Every time is in seconds since the edit started (t = 0 when the first request may leave); sizes are bytes and
    rates bytes/s. Layer indices are 0 .. len(ladders) - 1 and one shard holds one layer.
    """

    # fixed for the whole edit
    @property
    def profile(self) -> ComputeCosts:
        """The device's compute costs (seconds per layer, per template pass, per edit)."""

    @property
    def ladders(self) -> list[list[Level]]:
        """``ladders[layer]``: that shard's representations, cheapest first (the policy's family only)."""

    @property
    def floor(self) -> int | list[int]:
        """Index of the quality floor (the cheapest level a policy may pick) in every ladder, or one per shard."""

    @property
    def estimator(self) -> ThroughputEstimator:
        """Throughput estimator fed with completed transfers (bytes/s)."""

    @property
    def trace(self) -> Trace | None:
        """The link's rate over time, or None for a live link with no trace (nothing to read: the trace-reading rules
        then use the estimator's rate); only the trace-reading policies (cachegen's rule, the oracle) use it."""

    @property
    def rtt_s(self) -> float:
        """Round trip charged per request in predictions, seconds."""

    @property
    def layers_per_step(self) -> int:
        """Model layers L. Shards are indexed g = step * L + layer in execution order: ``len(ladders)`` is L in
        ``single`` KV mode (one KV per layer serves every step) and steps * L in ``per-step`` mode, where the template
        pass restarts at every step (``template_alive`` is true again when the compute lane enters a step)."""

    @property
    def start_s(self) -> float:
        """Where on ``trace`` the edit started, seconds: the link at edit time t is the trace at start_s + t."""

    @property
    def latency_target_s(self) -> float | None:
        """The user's latency target for the whole edit, seconds, or None."""

    # dynamic (seconds since the edit started)
    @property
    def now(self) -> float:
        """The current time, seconds."""

    @property
    def link_free(self) -> float:
        """When the link finishes its current transfer (<= ``now`` when idle), seconds."""

    @property
    def decoder_free(self) -> float:
        """When the decoder finishes its queued work, seconds."""

    @property
    def compute_layer(self) -> int:
        """The step-0 layer the compute lane is at (about to run)."""

    @property
    def compute_t(self) -> float:
        """When the compute lane starts ``compute_layer``, seconds."""

    @property
    def template_alive(self) -> bool:
        """The template tokens are still in step 0's sequence (not dropped yet)."""

    @property
    def dropped_at(self) -> int:
        """The layer (within the compute lane's step) where that step's template tokens were dropped; the device
        keeps their hidden state there, so a fallback template pass resumes from it. ``layers_per_step`` while
        the template is alive."""

    @property
    def next_layer(self) -> int:
        """The next shard the fetch lane will ask the policy about; shards below it are decided."""

    @property
    def stalled_s(self) -> float:
        """Seconds the compute lane has waited for shards so far in this edit (the wait in progress included)."""

    @property
    def got(self) -> dict[int, list[tuple[int, float]]]:
        """``got[layer]``: ``(level index, decoded-at seconds)`` of every fetched level, in fetch order."""

    @property
    def in_flight(self) -> dict[int, float]:
        """``in_flight[layer]``: predicted decoded-at time (seconds) of a shard requested but not decoded yet."""

    def flush_observations(self) -> None:
        """Feed the estimator every transfer completed by ``now`` (and none from later)."""


_STATE_MEMBERS = tuple(name for name in vars(PolicyState) if not name.startswith("_"))
