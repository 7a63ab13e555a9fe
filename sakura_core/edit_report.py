"""The one report format of an edit against a template, local (ComfyUI sampler, CLI demo) or on the phone.

A report is a JSON object whose keys come in the order of :data:`REPORT_KEYS`: a one-line ``summary`` first
(policy, latency, bytes fetched and how much of them the edit used, the split or what a fallback computed here,
link, PSNR when known: :class:`KVUse` states it), the figures, the policy's decisions and fallbacks,
where the edit ran (``executed_on``: the phone agent fills in its device, memory and job sections there), and the
timeline last. :func:`edit_report` builds it from a pipelined run; both the local path and the phone agent call it
(through :func:`sakura_core.edit.run_template_edit`), so the two shapes are the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["REPORT_KEYS", "TIMELINE_ORIGIN", "KVUse", "edit_report", "summary_line", "with_psnr", "with_timing"]

REPORT_KEYS = (
    "summary",
    "policy",
    "template_id",
    "latency_s",
    "bytes_fetched",
    "bytes_used",
    "peak_kv_bytes",
    "split_layer",
    "levels_used",
    "kv_mode",
    "split_layers",
    "floor_level",
    "decisions",
    "fallbacks",
    "link",
    "steps",
    "seed",
    "latency_target_s",
    "template",
    "profile",
    "image_sha256",
    "executed_on",
    "timeline_origin",
    "timeline",
)
TIMELINE_ORIGIN = "seconds since the pipelined edit started; negative = before it (the template image fetch)"


@dataclass(frozen=True)
class KVUse:
    """What an edit did with the template KV: what it fetched, what the compute lane injected of it, where it split
    the template and what it computed here after a fallback — the facts the summary line states.

    Attributes:
        bytes_fetched: bytes received over the link (every level, upgrades and failed tries included).
        bytes_used: the part of them whose KV the compute lane injected (``RunReport.bytes_used``).
        layers: the model's layers (per step).
        split_layer: step 0's split (``layers``: the template tokens ran through every layer).
        split_layers: each step's split in per-step mode; empty in single mode.
        fetched: shards whose fetched KV the compute lane injected (the layer; ``step * layers + layer`` per step).
        computed_here: shards whose KV a fallback template pass computed here (a shard late, or not fetched).
        fallback_reasons: why the device computed them (the runtime's "device" decisions), each once, in order.
    """

    bytes_fetched: int
    bytes_used: int
    layers: int
    split_layer: int
    split_layers: tuple[int, ...] = ()
    fetched: tuple[int, ...] = ()
    computed_here: tuple[int, ...] = ()
    fallback_reasons: tuple[str, ...] = ()

    @classmethod
    def of_run(cls, run, layers: int) -> KVUse:
        """The KV use of a pipelined run (``sakura_core.runtime.pipeline.RunReport``) of a ``layers``-layer model."""
        result, levels = run.result, run.levels_used
        per_step = run.kv_mode == "per-step" and len(result.split_layers) > 1
        reasons = [d["reason"] for d in result.decisions if d.get("level") == "device"]
        return cls(
            bytes_fetched=int(result.bytes_fetched),
            bytes_used=int(run.bytes_used),
            layers=layers,
            split_layer=int(result.split_layer),
            split_layers=tuple(result.split_layers) if per_step else (),
            fetched=tuple(sorted(g for g, names in levels.items() if set(names) - {"device", "template"})),
            computed_here=tuple(sorted(g for g, names in levels.items() if "device" in names)),
            fallback_reasons=tuple(dict.fromkeys(reasons)),
        )

    @property
    def per_step(self) -> bool:
        return bool(self.split_layers)

    def fetch_clause(self) -> str:
        """``"nothing fetched"``, ``"fetched 133.6 KiB, used none"`` or ``"fetched 456.7 KiB, used 401.2 KiB
        (layers 3-7)"`` (per-step: ``"(20 of 24 shards)"``)."""
        if not self.bytes_fetched and not self.fetched:
            return "nothing fetched"
        fetched = f"fetched {_kib(self.bytes_fetched)}"
        if not self.fetched:
            return f"{fetched}, used none"
        return f"{fetched}, used {_kib(self.bytes_used)} ({self._where(self.fetched)})"

    def compute_clause(self) -> str:
        """Where the template KV came from besides the link: ``"every layer computed here"`` (no split), ``"split at
        layer 3 of 8"`` / ``"splits per step [3, 0, 0] of 8"``, or after a fallback ``"planned split at layer 0 of 8;
        fell back: every layer computed here (shards late: ...)"``."""
        if self.per_step and min(self.split_layers) < self.layers:
            split = f"splits per step {list(self.split_layers)} of {self.layers}"
        elif not self.per_step and self.split_layer < self.layers:
            split = f"split at layer {self.split_layer} of {self.layers}"
        else:
            split = None
        if self.computed_here:
            why = "; ".join(self.fallback_reasons) or "a shard failed or was late"
            fell_back = f"fell back: {self._here()} computed here ({why})"
            return fell_back if split is None else f"planned {split}; {fell_back}"
        return split if split is not None else "every layer computed here"

    def describe(self) -> str:
        """The summary's KV part: the fetch clause, then the compute clause; ``"fetched 133.6 KiB, used none:
        computing was faster here (every layer computed here)"`` when the template ran through every layer although
        the link brought KV."""
        fetch, compute = self.fetch_clause(), self.compute_clause()
        if self.bytes_fetched and not self.fetched and not self.computed_here and compute.startswith("every layer"):
            return f"{fetch}: computing was faster here ({compute})"
        return f"{fetch}, {compute}"

    def _here(self) -> str:
        """What the fallback computed here: every layer (with those the template ran through before the split),
        the layers, or per step how many shards."""
        L = self.layers
        if self.per_step:  # the template tokens ran below each step's split
            ran = {s * L + layer for s, k in enumerate(self.split_layers) for layer in range(min(k, L))}
            shards = len(self.split_layers) * L
            here = ran | set(self.computed_here)
            return "every layer" if len(here) >= shards else f"{len(self.computed_here)} of {shards} shards"
        here = set(self.computed_here) | set(range(min(self.split_layer, L)))
        return "every layer" if len(here) >= L else _layers(self.computed_here)

    def _where(self, shards: tuple[int, ...]) -> str:
        if self.per_step:
            total = len(self.split_layers) * self.layers
            return "every layer of every step" if len(shards) >= total else f"{len(shards)} of {total} shards"
        return "every layer" if len(shards) >= self.layers else _layers(shards)


def _kib(nbytes: int) -> str:
    return f"{nbytes / 2**10:.1f} KiB"


def _layers(layers) -> str:
    """``"layer 5"``, ``"layers 3-5, 7"``."""
    runs: list[list[int]] = []
    for x in sorted(layers):
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"layer {text}" if len(runs) == 1 and runs[0][0] == runs[0][1] else f"layers {text}"


def summary_line(policy: str, latency_s: float, use: KVUse, link_label: str, psnr_db: float | None = None) -> str:
    """``"sakura: 1.23 s, fetched 456.7 KiB, used 401.2 KiB (layers 3-7), split at layer 3 of 8, trace
    norway_bus_1[, PSNR 38.1 dB]"``: the latency, then :meth:`KVUse.describe` (what was fetched, what of it was
    used, and where the template KV came from: the split, per-step splits, or what a fallback computed here)."""
    line = f"{policy}: {latency_s:.2f} s, {use.describe()}, {link_label}"
    return line if psnr_db is None else f"{line}, PSNR {psnr_db:.1f} dB"


def _levels_used(run) -> dict[str, list[str]] | str:
    """Single mode: ``{"layer": [level per step]}``; per-step mode: ``{"step s": [level per layer]}``; ``"none
    fetched"`` when no layer took injected KV and nothing was fetched, ``"none used"`` when KV was fetched."""
    if not run.levels_used:
        return "none used" if run.result.bytes_fetched else "none fetched"
    if run.kv_mode == "per-step":
        return run.levels_by_step()
    return {str(layer): list(names) for layer, names in sorted(run.levels_used.items())}


def edit_report(
    run,
    *,
    template_id: str,
    template: dict,
    link,
    steps: int,
    seed: int,
    latency_target_s: float | None,
    floor_level: str,
    profile,
    executed_on: dict,
    extra_events: Sequence[dict] = (),
    psnr_db: float | None = None,
) -> dict:
    """The report of one pipelined run (``sakura_core.runtime.pipeline.RunReport``), keys in :data:`REPORT_KEYS`.

    Args:
        template: what the report says about the template (``OpenedTemplate.summary()``).
        link: the ``LinkSpec`` the edit ran over (``link`` holds its string form, the summary its short label).
        profile: the ``LiveProfile`` the policy predicted with (its ``steps``: the edit's).
        executed_on: where the edit ran (``{"kind": "local", ...}``; the phone agent replaces it with its own).
        extra_events: timeline events from before the run (the template image fetch), placed first.
        psnr_db: the edited image's PSNR against a reference, when the caller knows one.
    """
    layers = int(profile.layers)
    image, result = np.ascontiguousarray(run.image), run.result
    use = KVUse.of_run(run, layers)
    report = {
        "summary": summary_line(result.policy, result.latency_s, use, link.label, psnr_db),
        "policy": result.policy,
        "template_id": template_id,
        "latency_s": result.latency_s,
        "bytes_fetched": result.bytes_fetched,
        "bytes_used": use.bytes_used,
        "peak_kv_bytes": int(result.peak_kv_bytes),
        "split_layer": result.split_layer,
        "levels_used": _levels_used(run),
        "kv_mode": run.kv_mode,
        "split_layers": list(result.split_layers),
        "floor_level": floor_level,
        "decisions": result.decisions,
        "fallbacks": run.fallbacks,
        "link": link.to_wire(),
        "steps": steps,
        "seed": seed,
        "latency_target_s": latency_target_s,
        "template": template,
        "profile": {
            "layer_full_s": profile.layer_full_s,
            "layer_cached_s": profile.layer_cached_s,
            "layers": layers,
            "steps": int(profile.steps),  # what the policy predicted: the edit's steps
        },
        "image_sha256": hashlib.sha256(image.tobytes()).hexdigest(),
        "executed_on": executed_on,
        "timeline_origin": TIMELINE_ORIGIN,
        "timeline": [*extra_events, *result.events],
    }
    return report


def with_psnr(report: dict, psnr_db: float) -> dict:
    """``report`` with its summary line ending in the PSNR (the caller measured it against a reference)."""
    return {**report, "summary": f"{report['summary']}, PSNR {psnr_db:.1f} dB"}


def with_timing(report: dict, timing: dict) -> dict:
    """``report`` of an edit run with EMULATED phone timing (``EmulatedTiming.describe``): the summary says so and
    ``executed_on["timing"]`` holds the emulation (profile, per-layer times, byte scale)."""
    summary = f"{report['summary']}, EMULATED {timing['profile']} timing"
    return {**report, "summary": summary, "executed_on": {**report["executed_on"], "timing": timing}}
