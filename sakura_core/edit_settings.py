"""How one edit runs, validated once: :class:`EditSettings` (prompt, steps, seed) holding its :class:`FetchSettings`
(policy, link, latency target).

    settings = EditSettings("place it", steps=8, seed=0, fetch=FetchSettings("sakura", LinkSpec.parse("fixed:20")))

The ComfyUI fetch node builds the :class:`FetchSettings` (its widgets: the policy, the link) before the sampler's
prompt, steps and seed are known; the sampler wraps it in the edit's :class:`EditSettings`, the phone agent builds
both from a job header, the demo from its arguments; ``sakura_core.edit.run_template_edit`` takes the one object.
:func:`runnable_policy` is the one check of a policy name: :class:`FetchSettings` calls it, nothing else does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fetch.link import LinkSpec
from .limits import check_prompt
from .policy.plan import runnable_policies

__all__ = ["EditSettings", "FetchSettings", "MAX_SEED", "runnable_policy"]

#: seeds run from 0 to this, exclusive (a 64-bit signed generator seed)
MAX_SEED = 2**63


def runnable_policy(name: str) -> str:
    """``name`` when it is a policy an edit can run (``sakura_core.policy.plan.runnable_policies()``), else a
    ``ValueError`` listing them: the one check of a policy name (:class:`FetchSettings` makes it)."""
    if name not in runnable_policies():
        raise ValueError(f"policy {name!r} cannot run an edit; choose one of {', '.join(runnable_policies())}")
    return name


@dataclass(frozen=True)
class FetchSettings:
    """How an edit fetches its template's KV (the part of :class:`EditSettings` a ComfyUI fetch node chooses).

    Attributes:
        policy: fetch policy name, one of ``sakura_core.policy.plan.runnable_policies()`` (checked here, once).
        link: the link (a ``LinkSpec``: the real link, or emulated at a fixed rate / by a trace, paced in the client);
            its string form ("live", "fixed:<Mbit/s>", "trace:<path>") is parsed (and a trace file read) once, here.
        latency_target_s: the edit's latency target in seconds (> 0), or None (see ``RuntimeConfig``).
    """

    policy: str = "sakura"
    link: LinkSpec = field(default_factory=LinkSpec.live)
    latency_target_s: float | None = None

    def __post_init__(self) -> None:
        runnable_policy(self.policy)  # raises with the choices named
        object.__setattr__(self, "link", LinkSpec.parse(self.link))  # raises with the bad value named
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            raise ValueError(f"latency_target_s must be > 0 seconds or None, got {self.latency_target_s}")


@dataclass(frozen=True)
class EditSettings:
    """How to edit (everything except the private image and the template), validated once, here.

    Attributes:
        prompt: edit prompt (stays on the device; ``sakura_core.limits.check_prompt``).
        steps: denoising steps (an integer >= 1).
        seed: noise seed (an integer in 0..2**63-1; same seed, same image).
        fetch: the policy, link and latency target (:class:`FetchSettings`, validated when it was built).
    """

    prompt: str
    steps: int = 8
    seed: int = 0
    fetch: FetchSettings = field(default_factory=FetchSettings)

    def __post_init__(self) -> None:
        check_prompt(self.prompt)
        for name, value in (("steps", self.steps), ("seed", self.seed)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"seed must be in 0..2**63-1, got {self.seed}")
        if not isinstance(self.fetch, FetchSettings):
            raise ValueError(f"fetch must be a FetchSettings (policy, link, latency target), got {self.fetch!r}")

    @property
    def policy(self) -> str:
        return self.fetch.policy

    @property
    def link(self) -> LinkSpec:
        return self.fetch.link

    @property
    def latency_target_s(self) -> float | None:
        return self.fetch.latency_target_s
