"""The one report format of an edit against a template, local (ComfyUI sampler, CLI demo) or on the phone.

A report is a JSON object whose keys come in the order of :data:`REPORT_KEYS`: a one-line ``summary`` first
(policy, latency, bytes fetched, split, link, PSNR when known), the figures, the policy's decisions and fallbacks,
where the edit ran (``executed_on``: the phone agent fills in its device, memory and job sections there), and the
timeline last. :func:`edit_report` builds it from a pipelined run; both the local path and the phone agent call it
(through :func:`sakura_core.edit.run_template_edit`), so the two shapes are the same.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["REPORT_KEYS", "TIMELINE_ORIGIN", "edit_report", "summary_line", "with_psnr", "with_timing"]

REPORT_KEYS = (
    "summary",
    "policy",
    "template_id",
    "latency_s",
    "bytes_fetched",
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


def summary_line(
    policy: str,
    latency_s: float,
    bytes_fetched: int,
    split_layer: int,
    layers: int,
    link_label: str,
    psnr_db: float | None = None,
    split_layers: list[int] | None = None,
) -> str:
    """``"sakura: 1.23 s, 456.7 KiB fetched, split at layer 3 of 8, trace norway_bus_1[, PSNR 38.1 dB]"``; with the
    per-step splits ``split_layers`` (per-step mode): ``"splits per step [3, 0, 0] of 8"``."""
    split = "every layer computed here" if split_layer >= layers else f"split at layer {split_layer} of {layers}"
    if split_layers and len(split_layers) > 1:
        split = f"splits per step {list(split_layers)} of {layers}"
    line = f"{policy}: {latency_s:.2f} s, {bytes_fetched / 2**10:.1f} KiB fetched, {split}, {link_label}"
    return line if psnr_db is None else f"{line}, PSNR {psnr_db:.1f} dB"


def _levels_used(run) -> dict[str, list[str]] | str:
    """Single mode: ``{"layer": [level per step]}``; per-step mode: ``{"step s": [level per layer]}``."""
    if not run.levels_used:
        return "none fetched"
    if getattr(run, "kv_mode", "single") == "per-step":
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
    extra_events: list[dict] = (),
    psnr_db: float | None = None,
) -> dict:
    """The report of one pipelined run (``sakura_core.runtime.pipeline.RunReport``), keys in :data:`REPORT_KEYS`.

    Args:
        template: what the report says about the template (``OpenedTemplate.summary()``).
        link: the ``LinkSpec`` the edit ran over (``link`` holds its string form, the summary its short label).
        profile: the ``LiveProfile`` the policy predicted with.
        executed_on: where the edit ran (``{"kind": "local", ...}``; the phone agent replaces it with its own).
        extra_events: timeline events from before the run (the template image fetch), placed first.
        psnr_db: the edited image's PSNR against a reference, when the caller knows one.
    """
    layers = int(profile.layers)
    image = np.ascontiguousarray(run.image)
    report = {
        "summary": summary_line(
            run.policy,
            run.latency_s,
            run.bytes_fetched,
            run.split_layer,
            layers,
            link.label,
            psnr_db,
            getattr(run, "split_layers", None),
        ),  # fmt: skip
        "policy": run.policy,
        "template_id": template_id,
        "latency_s": run.latency_s,
        "bytes_fetched": run.bytes_fetched,
        "peak_kv_bytes": int(getattr(run, "peak_kv_bytes", 0)),
        "split_layer": run.split_layer,
        "levels_used": _levels_used(run),
        "kv_mode": getattr(run, "kv_mode", "single"),
        "split_layers": list(getattr(run, "split_layers", [])),
        "floor_level": floor_level,
        "decisions": run.decisions,
        "fallbacks": run.fallbacks,
        "link": link.to_wire(),
        "steps": steps,
        "seed": seed,
        "latency_target_s": latency_target_s,
        "template": template,
        "profile": {"layer_full_s": profile.layer_full_s, "layer_cached_s": profile.layer_cached_s, "layers": layers},
        "image_sha256": hashlib.sha256(image.tobytes()).hexdigest(),
        "executed_on": executed_on,
        "timeline_origin": TIMELINE_ORIGIN,
        "timeline": [*extra_events, *run.events],
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
