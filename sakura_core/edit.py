"""The one entry for "edit a private image against a published template", used by the ComfyUI nodes, the phone agent
and the CLI demo.

    opened = await open_template(ServerSource(url, token), "face-swap-astronaut", model)   # manifest + template image
    settings = EditSettings(prompt, steps=8, fetch=FetchSettings("sakura", LinkSpec.parse("fixed:20")))
    outcome = await run_template_edit(model, opened, user_image, settings)                 # image + report

:func:`open_template` (``sakura_core.template_open``) fetches the template's manifest and image(s) from a source (a
server URL, a :class:`ServerSource`, or a :class:`StoreSource` for a store folder read directly:
``sakura_core.fetch.sources``) and checks them against the model once (:func:`check_template`: model id, token grid,
template image named). :class:`EditSettings` (``sakura_core.edit_settings``) is how to edit, validated once.
:func:`run_template_edit` plans the fetch with the policy (``sakura_core.policy.plan.plan_fetch``), paces the
source's shard fetches by the link, runs the pipelined edit (which checks a per-step template's schedule against
the model's, once) and builds the report (:mod:`sakura_core.edit_report`). :func:`edit_from_server` does both for an
:class:`EditRequest` (the phone agent's job, the demo). The user image and prompt stay in this process; only
manifest and shard requests leave it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from .edit_report import edit_report, with_timing
from .edit_settings import EditSettings, FetchSettings
from .fetch.link import shaped_fetcher
from .fetch.sources import ServerSource, StoreSource, TemplateSource
from .kv.manifest import Manifest, ModelMismatchError
from .models.edit_model import EditModel, load_image
from .policy.plan import plan_fetch
from .runtime.backend import backend_of
from .runtime.emulated_device import EmulatedTiming
from .runtime.lane_parts import EditInputs, RunControls
from .runtime.live_profile import LiveProfile, measure_profile
from .runtime.pipeline import LiveSettings, RunReport, RuntimeConfig, run_pipelined_edit
from .template_check import ModelKey, check_template, template_grid_fits
from .template_open import OpenedTemplate, open_checked_template, open_template

__all__ = [
    "EditOutcome",
    "EditRequest",
    "EditSettings",
    "EmulatedTiming",
    "FetchSettings",
    "ModelKey",
    "OpenedTemplate",
    "ServerSource",
    "StoreSource",
    "TemplateSource",
    "check_template",
    "edit_from_server",
    "open_checked_template",
    "open_template",
    "run_template_edit",
]


@dataclass
class EditOutcome:
    """The edited image ((S, S, 3) uint8), its report (:mod:`sakura_core.edit_report`) and the raw pipelined run."""

    image: np.ndarray
    report: dict
    run: RunReport = field(repr=False)


async def run_template_edit(
    model: EditModel,
    opened: OpenedTemplate,
    user_image: np.ndarray,
    settings: EditSettings,
    *,
    profile: LiveProfile | None = None,
    cancel: threading.Event | None = None,
    on_layer: Callable[[int, int], None] | None = None,
    executed_on: dict | None = None,
    backend=None,
    prefetch_kv_bytes: int | None = None,
    timing: EmulatedTiming | None = None,
) -> EditOutcome:
    """Edit ``user_image`` against ``opened`` with ``settings`` (its policy, over its link).

    ``profile`` defaults to :func:`measure_profile` of ``model`` (measured once per model); the policy predicts
    ``settings.steps`` steps with it, whatever step count it was measured for. ``on_layer(step, layer)`` is called
    before each layer; ``cancel`` stops between layers (``runtime.pipeline.Cancelled``).
    ``executed_on`` goes into the report as is (default ``{"kind": "local"}``). ``backend`` runs the model's blocks
    (``sakura_core.runtime.backend``; None = the torch adapter). ``prefetch_kv_bytes``: the memory the device lends
    to KV prefetched for later steps (``RuntimeConfig.prefetch_kv_bytes``; None = no limit). ``timing``: EMULATED
    phone timing (``runtime.emulated_device``; needs an emulated link): compute paced to a phone profile, the link
    slowed to phone-size shards, the policy predicting with those times; the report says so.
    """
    key = _check_model(model, opened)
    trace = settings.link.trace()
    if timing is not None:
        if trace is None:
            raise ValueError(
                "emulated phone timing needs an emulated link (fixed Mbit/s or a trace file): the live "
                "link's shards cannot be paced at phone scale"
            )
        trace, profile = timing.phone_scale_trace(trace), timing.live_profile(settings.steps)
        backend = timing.backend(backend_of(model, backend))
    profile = profile if profile is not None else measure_profile(model, settings.steps)
    if profile.steps != settings.steps:  # measured once for another step count (the phone agent's): the edit's own
        profile = replace(profile, steps=settings.steps)
    plan = plan_fetch(opened.manifest, settings.policy)
    size = model.spec.image_size
    # a template larger than the edit keeps its own size (each reference's grid is the manifest's)
    template = opened.template_image(size * opened.ref_grids[0][0] // key.token_grid[0])
    user = load_image(user_image, size)
    config = RuntimeConfig(
        latency_target_s=settings.latency_target_s,
        prefetch_kv_bytes=prefetch_kv_bytes,
        live=LiveSettings(
            steps=settings.steps,
            seed=settings.seed,
            estimator=timing.estimator_config() if timing is not None else None,
            pre_lanes=opened.pre_lanes() if trace is None else (),
        ),
    )
    async with opened.source.open() as shards:
        t0 = time.monotonic()
        run = await run_pipelined_edit(
            EditInputs(model, user, settings.prompt, template, backend=backend),
            opened.manifest,
            shaped_fetcher(shards, trace),
            plan,
            profile,
            trace=trace,
            config=config,
            controls=RunControls(cancel=cancel, on_layer=on_layer),
        )
    report = _report(run, opened, settings, plan.floor_name, profile, executed_on, t0)
    if timing is not None:
        report = with_timing(report, timing.describe(run.result.bytes_fetched))
    return EditOutcome(run.image, report, run)


def _check_model(model: EditModel, opened: OpenedTemplate) -> ModelKey:
    """``model``'s key; ``ModelMismatchError`` naming both when ``opened`` was opened for another model or grid."""
    key = ModelKey.of(model)
    if opened.model_id != key.model_id or not template_grid_fits(opened.ref_grids, key.token_grid):
        raise ModelMismatchError(
            f"template {opened.template_id!r} was opened for model {opened.model_id[:16]} (grid "
            f"{list(opened.token_grid)}), the edit runs model {key.model_id[:16]} (grid "
            f"{list(key.token_grid)}); open the template with the model that edits"
        )
    return key


def _report(
    run: RunReport,
    opened: OpenedTemplate,
    settings: EditSettings,
    floor_level: str,
    profile: LiveProfile,
    executed_on: dict | None,
    t0: float,
) -> dict:
    """The edit's report (:func:`edit_report`), the template image's fetch (``t0``: the lanes' start) an event."""
    started, finished = opened.image_fetch_s
    image_event = {
        "lane": "fetch",
        "start": started - t0,
        "end": finished - t0,
        "layer": -1,
        "level": "template image",
    }
    return edit_report(
        run,
        template_id=opened.template_id,
        template=opened.summary(),
        link=settings.link,
        steps=settings.steps,
        seed=settings.seed,
        latency_target_s=settings.latency_target_s,
        floor_level=floor_level,
        profile=profile,
        executed_on=executed_on if executed_on is not None else {"kind": "local"},
        extra_events=[image_event],
    )


@dataclass(frozen=True)
class EditRequest:
    """One edit against a template on a server, besides the private image (the phone agent's job, the demo).

    Attributes:
        source: the SAKURA server (or CDN) serving the template: its URL, read token and, for the phone agent, the
            checked addresses of its host (``ServerSource``).
        template_id: template to edit against.
        settings: how to edit (prompt, steps, seed, policy, link, latency target: validated when they were built).
    """

    source: ServerSource
    template_id: str
    settings: EditSettings


async def edit_from_server(
    model: EditModel,
    request: EditRequest,
    user_image: np.ndarray,
    *,
    profile: LiveProfile | None = None,
    cancel: threading.Event | None = None,
    on_layer: Callable[[int, int], None] | None = None,
    backend=None,
    prefetch_kv_bytes: int | None = None,
    manifest: Manifest | None = None,
) -> EditOutcome:
    """:func:`open_template` then :func:`run_template_edit` for ``request`` (``backend``, ``prefetch_kv_bytes``: see
    there). ``manifest``: the request's template already fetched and checked against ``model``
    (``sakura_core.template_open.fetch_template_manifest``, as the phone agent does when it admits a job): only the image is fetched."""
    if manifest is not None:
        opened = await open_checked_template(request.source, manifest)
    else:
        opened = await open_template(request.source, request.template_id, model)
    return await run_template_edit(
        model,
        opened,
        user_image,
        request.settings,
        profile=profile,
        cancel=cancel,
        on_layer=on_layer,
        backend=backend,
        prefetch_kv_bytes=prefetch_kv_bytes,
    )
