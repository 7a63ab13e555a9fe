"""The live fetch lane's re-roots (:class:`RerootChains`, a mixin of
:class:`~sakura_core.runtime.fetch_lane.FetchLane`): before a shard chosen at its floor, the chain of shards the
policy names (:func:`~sakura_core.runtime.lane_rules.ask_reroot_chain`, the simulator's call too;
:mod:`sakura_core.policy.reroot`) is fetched in order, each at its floor and decoded only as the next one's reference,
so the shard then comes as its closed-loop twin. A chain shard the compute lane has passed is held apart
(:meth:`~sakura_core.runtime.held_kv.HeldKV.hold_chain`) and freed once the next one is decoded; one it has not
passed is published as any fetched shard (it is that step's KV). A chain shard that fails (corrupt, missing) or
whose own reference is no longer held on the track ends the chain: the shard comes as its open-loop floor, as a
shard off its track always does, and the run's fallbacks say so; a failed chain shard the compute lane has not
passed is left to the device, as any failed shard."""

from __future__ import annotations

from .lane_parts import PartsView
from .lane_rules import ask_reroot_chain
from .reference_wait import ReferenceWait
from .shard_index import ShardId

__all__ = ["RerootChains"]


class RerootChains(PartsView):
    """Mixin: the re-root chains of the live fetch lane (see the module docstring)."""

    refs: ReferenceWait  # FetchLane's

    async def _fetch_level(self, shard: ShardId, level: int, gated: bool = True, as_chain: bool = False) -> None: ...

    def _chain_for(self, shard: ShardId, level: int) -> list[tuple[int, str]]:
        """The chain the policy names before ``shard`` at ``level`` (the caller holds the lock and a frozen
        moment); each chain shard is requested from now on (``in_flight``), as the simulator's are."""
        chain = ask_reroot_chain(self.policy, self.ctx, shard.g, level)
        for c, _ in chain:
            fl = self.ctx.floor_of(c)
            self.st.in_flight[c] = self.ctx.predict_ready(c, self.ladders[c][fl], self.st.estimator.robust())
        return chain

    async def _fetch_chain(self, chain: list[tuple[int, str]], target: ShardId) -> list[ShardId]:
        """Fetch ``chain`` (from :meth:`_chain_for`) in order before ``target``; returns the chain shards whose KV
        is held apart (the caller frees them, :meth:`_drop_chain`, once ``target`` is decoded). On a chain shard
        that cannot serve, the chain ends and nothing of it is kept: ``target`` comes off its track."""
        st, kept = self.st, list[ShardId]()
        for i, (c, why) in enumerate(chain):
            shard, fl = self.grid[c], self.ctx.floor_of(c)
            planned = self.rungs[c][fl].rep
            if planned.closed_twin is not None and self.held.closed_twin(shard, planned) is None:
                self._chain_ends(chain[i:], f"re-root of {target}: {shard}'s reference is not held on its track")
                return self._drop_chain(kept)
            with st.lock:
                self.log.decision(st.now, c, fl, why)
            try:
                with self.refs.fetching(c):
                    await self._fetch_level(shard, fl, as_chain=True)
            except Exception as e:  # noqa: BLE001 - every failure ends the chain the same way, and it is reported
                self._chain_ends(chain[i:], f"re-root of {target}: {shard} level {self.ladders[c][fl].name}: {e}")
                if c >= self.held.released_below:  # not passed: the compute lane uses the device's KV for it
                    self.held.fail(shard)
                return self._drop_chain(kept)
            self._drop_chain(kept)  # decoded: the one before it served as its reference
            kept = [shard]
        return kept

    def _chain_ends(self, rest: list[tuple[int, str]], why: str) -> None:
        """The chain stops before ``rest``: those shards are not requested any more; the fallback is reported."""
        with self.st.lock:
            for c, _ in rest:
                self.st.in_flight.pop(c, None)
        self.log.fallback(f"{why}; the shard comes as its open-loop floor (off its twins' track)")

    def _drop_chain(self, shards: list[ShardId]) -> list[ShardId]:
        """Free the chain KV of ``shards`` (held apart; a published one is freed as any shard is). Returns []."""
        for shard in shards:
            self.held.drop_chain(shard)
        return []
