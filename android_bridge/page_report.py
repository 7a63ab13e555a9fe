"""A phone page's edit report (``phone_web/src/edit.js``) in the one report format (``sakura_core.edit_report``):
the keys of ``REPORT_KEYS`` in their order, what the page measured, ``executed_on`` naming the browser and the
execution provider that ran. The page fetches fp16 for every layer it does not compute itself (no SAKURA policy runs
there yet), which ``policy`` and the summary say; ``policy_requested`` in ``executed_on`` keeps what the node asked."""

from __future__ import annotations

import hashlib

import numpy as np

from sakura_core.edit_report import REPORT_KEYS, TIMELINE_ORIGIN

__all__ = ["page_edit_report"]


def _timeline(timings: dict) -> list[dict]:
    """Lanes of what the page timed: the fetch and decode of the template KV, then one compute span per step."""
    fetch_s = float(timings.get("fetch_decode", 0.0))
    events = [{"lane": "fetch", "start": 0.0, "end": fetch_s, "layer": None, "level": "fp16"}]
    at = fetch_s + float(timings.get("template_layers", 0.0))
    for step, step_s in enumerate(timings.get("per_step", [])):
        events.append(
            {"lane": "compute", "start": at, "end": at + float(step_s), "layer": None, "level": "fp16", "step": step}
        )
        at += float(step_s)
    return events


def page_edit_report(
    page: dict, image: np.ndarray, *, template: dict, link: str, policy_requested: str, connection: str, cloud_url: str
) -> dict:
    """The report of an edit a page ran: ``page`` is the page's own report, ``image`` the (H, W, 3) result,
    ``template`` what the report says about the template, ``link`` the link's wire form."""
    timings = dict(page.get("timings_s", {}))
    latency_s = float(timings.get("total", 0.0))
    fetched = int(page.get("bytes_fetched", 0))
    on = dict(page.get("executed_on", {}))
    ep = on.get("execution_provider", "?")
    policy = str(page.get("policy", "fp16 for every layer"))
    report = {
        "summary": f"{policy} on the phone page ({ep}), {latency_s:.2f} s, {fetched / 1024:.1f} KiB fetched",
        "policy": policy,
        "template_id": page.get("template_id", template.get("template_id")),
        "latency_s": latency_s,
        "bytes_fetched": fetched,
        "bytes_used": fetched,
        "peak_kv_bytes": 0,
        "split_layer": int(page.get("split_layer", 0)),
        "levels_used": str(page.get("level", "fp16")),
        "kv_mode": page.get("kv_mode", "single"),
        "split_layers": [],
        "floor_level": str(page.get("level", "fp16")),
        "decisions": [],
        "fallbacks": [],
        "link": link,
        "steps": int(page.get("steps", 0)),
        "seed": int(page.get("seed", 0)),
        "latency_target_s": None,
        "template": template,
        "profile": None,
        "image_sha256": hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest(),
        "executed_on": {
            **on,
            "connection": connection,
            "cloud_url": cloud_url,
            "policy_requested": policy_requested,
            "timings_s": timings,
        },
        "timeline_origin": TIMELINE_ORIGIN,
        "timeline": _timeline(timings),
    }
    return {key: report[key] for key in REPORT_KEYS}  # the one format's order (a KeyError if edit_report grows)
