"""The live fetch lane's asks beyond the in-order one (:class:`LaterAsks`, a mixin of
:class:`~sakura_core.runtime.fetch_lane.FetchLane`): the shards the policy deferred ("not now"), asked again before
later shards and while the link would idle (:func:`~sakura_core.runtime.deferral.ask_deferred`; those a fallback
template pass made leave first, :func:`~sakura_core.runtime.deferral.drop_made`), and the progressive upgrades asked
on the idle link once the base fetches are done (:func:`~sakura_core.runtime.lane_rules.ask_upgrade`). The same
protocol as the simulator's (:mod:`.sim_link`); the state lives on the lane."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .deferral import ask_deferred, drop_made
from .lane_parts import PartsView
from .lane_rules import ask_upgrade

if TYPE_CHECKING:
    from .shard_index import ShardId

__all__ = ["LaterAsks"]


class LaterAsks(PartsView):
    """Mixin: the deferred shards asked again and the upgrades (see the module docstring); the run's parts read
    through :class:`~.lane_parts.PartsView`."""

    # the lane's own state these read and write (set in FetchLane.__init__ / reset)
    deferred: list[int]  # shards (g) the policy said "not now" to
    _deferred_sig: tuple | None  # the state of the last "not now" to all of them
    _claimed: set[int]

    async def _room_for(self, shard: ShardId) -> None: ...  # FetchLane's

    async def _fetch_level(self, shard: ShardId, level: int, gated: bool = True, as_chain: bool = False) -> None: ...

    def _signature(self) -> tuple:
        """What a deferral depends on besides the clock: compute position, decisions, transfers, samples."""
        st = self.st
        done = sum(len(v) for v in st.got.values())
        return (st.compute_layer, st.template_alive, st.next_layer, done, len(st.in_flight), st.estimator.samples)

    def _ask_deferred(self) -> tuple[ShardId, int] | None:
        """Ask the policy again about each deferred shard the compute lane has not reached (the caller holds the
        lock and a frozen moment); ``(shard, level)`` for the first it wants. The same protocol as the simulator's;
        not asked again until something has happened (a layer, a decision, a transfer) since the last "not now"."""
        st = self.st
        drop_made(self.deferred, lambda g: self.held.device(self.grid[g]) is not None)
        if not self.deferred:
            return None
        sig = self._signature()
        if sig == self._deferred_sig:
            return None
        first_unreached = st.compute_layer + 1  # the lane runs compute_layer: it has not reached the shard after it
        pick = ask_deferred(self.policy, self.ctx, self.deferred, first_unreached, st.computed)
        if pick is None:
            self._deferred_sig = sig
            return None
        g, d = pick
        assert d.level is not None  # ask_deferred returns only a decision to fetch a level
        self._deferred_sig = None
        self._claimed.add(g)
        self.log.decision(st.now, g, d.level, d.reason)
        return self.grid[g], d.level

    async def _upgrade_once(self) -> bool | None:
        """One progressive enhancement the policy asks for on the idle link: True once fetched, False when it asks
        for none now, None when it failed (upgrades are optional: the failure is reported and upgrading stops)."""
        st = self.st
        with st.lock:
            st.link_free = st.now
            up = ask_upgrade(self.policy, self.ctx, self.cfg.upgrades, st.base_done)
        if up is None:
            return False
        shard, level = self.grid[up[0]], up[1]
        await self._room_for(shard)
        self.log.decision(st.now, shard.g, level, "upgrade")
        try:
            await self._fetch_level(shard, level)
        except Exception as e:  # noqa: BLE001 - an upgrade is optional: report and stop upgrading
            self.log.fallback(f"upgrade of {shard} to {self.ladders[shard.g][level].name} failed: {e}")
            return None
        return True
