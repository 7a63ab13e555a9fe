""":class:`RunLog`: what one pipelined run reports as it goes — the timeline of every lane's events, the policy's
decisions and the fallbacks — written by every lane (from the event loop, the compute thread and the decode pool:
appending to a list is atomic) and handed to the :class:`~sakura_core.runtime.pipeline_config.RunReport`."""

from __future__ import annotations

__all__ = ["RunLog"]


class RunLog:
    """The run's events, decisions and fallbacks (times in seconds since the edit started; ``layer`` is a shard's
    flat index ``g``, -1 for a whole-template pass). :meth:`reset` gives fresh lists, so a report keeps its own."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.events: list[dict] = []
        self.decisions: list[dict] = []
        self.fallbacks: list[str] = []

    def event(self, lane: str, start: float, end: float, layer: int, level) -> None:
        """A span of ``lane`` ("fetch", "decode", "compute", "stall") for shard ``layer`` (its ``g``)."""
        self.events.append({"lane": lane, "start": start, "end": end, "layer": layer, "level": level})

    def decision(self, t: float, layer: int, level, reason: str) -> None:
        """A decision about shard ``layer`` (its ``g``): a level index, "drop", "device" or a policy's other
        answer, and its reason."""
        self.decisions.append({"t": t, "layer": layer, "level": level, "reason": reason})

    def fallback(self, what: str) -> None:
        self.fallbacks.append(what)
