"""The one entry for "edit a private image against a published template", used by the ComfyUI nodes, the phone agent
and the CLI demo.

    opened = await open_template(ServerSource(url, token), "face-swap-astronaut", model)   # manifest + template image
    outcome = await run_template_edit(model, opened, user_image, EditSettings(prompt, steps=8, policy="sakura"),
                                      link=LinkSpec.parse("fixed:20"))                      # image + report

:func:`open_template` fetches the template's manifest and image(s) from a source (a server URL, a
:class:`ServerSource`, or a :class:`StoreSource` for a store folder read directly: ``sakura_core.fetch.sources``)
and checks them against the model once (:func:`check_template`: model id, token grid, template image named).
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
from .fetch.errors import TemplateNotFoundError
from .fetch.link import LinkSpec, shaped_fetcher
from .fetch.sources import ServerSource, StoreSource, TemplateSource
from .kv.manifest import Manifest, ManifestError, ModelMismatchError
from .limits import check_prompt
from .models.edit_model import EditModel, load_image
from .policy.plan import plan_fetch, runnable_policies
from .runtime.backend import backend_of
from .runtime.emulated_device import EmulatedTiming
from .runtime.lane_parts import EditInputs, RunControls
from .runtime.live_profile import LiveProfile, measure_profile
from .runtime.pipeline import LiveSettings, RunReport, RuntimeConfig, run_pipelined_edit
from .template_check import ModelKey, check_template, template_grid_fits

__all__ = [
    "EditOutcome",
    "EditRequest",
    "EditSettings",
    "EmulatedTiming",
    "ModelKey",
    "OpenedTemplate",
    "ServerSource",
    "StoreSource",
    "TemplateSource",
    "check_template",
    "edit_from_server",
    "fetch_template_manifest",
    "open_checked_template",
    "open_template",
    "run_template_edit",
    "runnable_policy",
]


def _source(source: TemplateSource | str, token: str | None = None) -> TemplateSource:
    return ServerSource(source, token) if isinstance(source, str) else source


async def _get_manifest(shards, label: str, template_id: str) -> Manifest:
    try:
        return await shards.get_manifest(template_id)
    except TemplateNotFoundError as e:
        catalog = await shards.get_catalog()
        ids = sorted(str(t.get("id")) for t in catalog.get("templates", []) if isinstance(t, dict))
        raise TemplateNotFoundError(
            f"template {template_id!r} is not in the catalog of {label}; published there: {', '.join(ids) or 'none'}"
        ) from e


async def fetch_template_manifest(
    source: TemplateSource | str, template_id: str, model: EditModel | ModelKey | None, *, token: str | None = None
) -> Manifest:
    """The template's manifest from ``source`` (parsed once, as it arrives), checked against ``model``
    (:func:`check_template`; ``None``: not checked here — the ComfyUI MODEL patch checks it against ComfyUI's
    model); an unknown id raises ``TemplateNotFoundError`` listing what is published there."""
    src = _source(source, token)
    async with src.open() as shards:
        manifest = await _get_manifest(shards, src.label, template_id)
    return manifest if model is None else check_template(manifest, template_id, ModelKey.of(model))


@dataclass(frozen=True)
class OpenedTemplate:
    """A template ready to edit against: where it is served, its checked manifest and its image file.

    Attributes:
        source: where the shards are fetched from during the edit.
        template_id: the template's id.
        model_id: content id of the model the manifest was checked against.
        manifest: the checked manifest (:func:`check_template`, typed to the leaves: what the edit reads).
        image_file: the template image as published (PNG bytes): the first reference's.
        image_fetch_s: (started, finished) of the image fetch(es), ``time.monotonic()`` seconds.
        reference_files: every reference image as published (PNG bytes), in order; ``(image_file,)`` for one.
    """

    source: TemplateSource
    template_id: str
    model_id: str
    manifest: Manifest = field(repr=False)
    image_file: bytes = field(repr=False)
    image_fetch_s: tuple[float, float] = (0.0, 0.0)
    reference_files: tuple[bytes, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.reference_files:
            object.__setattr__(self, "reference_files", (self.image_file,))

    @property
    def token_grid(self) -> tuple[int, ...]:
        return self.manifest.token_grid

    @property
    def ref_grids(self) -> tuple[tuple[int, int], ...]:
        """Each reference's token grid, in order (one entry for a one-reference template)."""
        return self.manifest.ref_grids

    @property
    def kv_mode(self) -> str:
        """``"single"`` (one KV per layer, any schedule) or ``"per-step"`` (one per (step, layer), one schedule)."""
        return self.manifest.kv_mode

    def template_image(self, size: int) -> np.ndarray | list[np.ndarray]:
        """The template image as (size, size, 3) uint8; a list of them, in order, for several references (each decoded
        with the pixel limits and mode-correct conversion of :func:`sakura_core.images.decode_image`)."""
        from .images import decode_image

        images = [
            load_image(decode_image(f, f"reference {i + 1} of template {self.template_id!r}")[0], size)
            for i, f in enumerate(self.reference_files)
        ]
        return images[0] if len(images) == 1 else images

    def pre_lanes(self) -> tuple[tuple[int, float], ...]:
        """The image fetch as the estimator's seed (``RuntimeConfig.pre_lanes``): its bytes and seconds, a transfer
        over the edit's link made just before the lanes (several references: their requests one after another, one
        sample, so only one of their round trips is taken off: the seed errs slow). Only for the live link: an
        emulated one paces the lanes' shards only, so the image never crossed it."""
        started, finished = self.image_fetch_s
        nbytes = sum(len(f) for f in self.reference_files)
        return ((nbytes, finished - started),) if nbytes > 0 and finished > started else ()

    def summary(self) -> dict:
        """What a report says about the template: ids, source, geometry, bytes per level and the image fetch."""
        levels: dict[str, int] = {}
        m = self.manifest
        for shard in m.shards:
            for rep in shard.representations:
                levels[rep.name] = levels.get(rep.name, 0) + rep.nbytes
        return {
            "template_id": self.template_id,
            "model_id": self.model_id,
            "source": self.source.label,
            "token_grid": list(self.token_grid),
            "references": [r.summary() for r in m.references],
            "num_layers": m.num_layers,
            "kv_mode": m.kv_mode,
            "schedule": m.schedule_label,
            "bytes_per_level": levels,
            "image_bytes": sum(len(f) for f in self.reference_files),
            "image_fetch_s": round(self.image_fetch_s[1] - self.image_fetch_s[0], 4),
        }


async def open_template(
    source: TemplateSource | str, template_id: str, model: EditModel | ModelKey, *, token: str | None = None
) -> OpenedTemplate:
    """Fetch the template's manifest, check it against ``model`` (:func:`check_template`) and fetch its image."""
    src, key = _source(source, token), ModelKey.of(model)
    async with src.open() as shards:
        manifest = check_template(await _get_manifest(shards, src.label, template_id), template_id, key)
        return await _with_image(src, shards, manifest)


async def open_checked_template(
    source: TemplateSource | str, manifest: Manifest, *, token: str | None = None
) -> OpenedTemplate:
    """A template whose manifest :func:`fetch_template_manifest` (or :func:`check_template`) already returned for
    the model that will edit: only its image is fetched (the manifest is neither fetched nor checked again)."""
    src = _source(source, token)
    async with src.open() as shards:
        return await _with_image(src, shards, manifest)


async def _with_image(source: TemplateSource, shards, manifest: Manifest) -> OpenedTemplate:
    """The opened template with its reference images fetched, in order (the first is ``template_image``)."""
    started = time.monotonic()
    fetched = []
    for i, r in enumerate(manifest.references):
        if r.image is None:
            raise ManifestError(
                f"template {manifest.template_id!r}: reference {i} has no image blob; the publisher adds it (sakura "
                "precompute ... --overwrite republishes the template)"
            )
        fetched.append(await shards.fetch_shard(r.image.digest, expected_bytes=r.image.nbytes))
    blobs = tuple(fetched)
    return OpenedTemplate(
        source, manifest.template_id, manifest.model_id, manifest, blobs[0], (started, time.monotonic()), blobs
    )


def runnable_policy(name: str) -> str:
    """``name`` when it is a policy an edit can run (``sakura_core.policy.plan.runnable_policies()``), else a
    ``ValueError`` listing them: the one check of a policy name (edit settings, the nodes' fetch settings)."""
    if name not in runnable_policies():
        raise ValueError(f"policy {name!r} cannot run an edit; choose one of {', '.join(runnable_policies())}")
    return name


@dataclass(frozen=True)
class EditSettings:
    """How to edit (everything except the private image, the template and the link).

    Attributes:
        prompt: edit prompt (stays on the device).
        steps: denoising steps (>= 1).
        seed: noise seed (same seed, same image).
        policy: fetch policy, one of ``sakura_core.policy.plan.runnable_policies()``.
        latency_target_s: the edit's latency target in seconds (> 0) or None (see ``RuntimeConfig``).
    """

    prompt: str
    steps: int = 8
    seed: int = 0
    policy: str = "sakura"
    latency_target_s: float | None = None
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_prompt(self.prompt)
        runnable_policy(self.policy)
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            raise ValueError(f"latency_target_s must be > 0 seconds or None, got {self.latency_target_s}")


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
    link: LinkSpec | str | None = None,
    profile: LiveProfile | None = None,
    cancel: threading.Event | None = None,
    on_layer: Callable[[int, int], None] | None = None,
    executed_on: dict | None = None,
    backend=None,
    prefetch_kv_bytes: int | None = None,
    timing: EmulatedTiming | None = None,
) -> EditOutcome:
    """Edit ``user_image`` against ``opened`` with ``settings.policy`` over ``link`` (default: the real link).

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
    link = LinkSpec.parse(link)
    trace = link.trace()
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
    report = _report(run, opened, settings, link, plan.floor_name, profile, executed_on, t0)
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
    link: LinkSpec,
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
        link=link,
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
        server_url: SAKURA server (or CDN) base URL.
        template_id: template to edit against.
        prompt: edit prompt (stays on the device).
        steps: denoising steps.
        seed: noise seed.
        policy: fetch policy name (one of ``runnable_policies()``).
        link: the link (a :class:`LinkSpec`, or its string form: "live", "fixed:<Mbit/s>", "trace:<path>").
        token: bearer token for a server with a read token (never shown in reprs).
        latency_target_s: the edit's latency target (seconds) or None.
        addresses: when given, the only IP addresses connected to for the server's host (the phone agent's checked
            resolution of the job's cloud host).
    """

    server_url: str
    template_id: str
    prompt: str
    steps: int = 8
    seed: int = 0
    policy: str = "sakura"
    link: LinkSpec | str | None = None
    token: str | None = field(default=None, repr=False)
    latency_target_s: float | None = None
    addresses: tuple[str, ...] = ()

    #: how to edit: built (and validated: prompt, policy, steps, latency target) once, from the fields above
    settings: EditSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "link", LinkSpec.parse(self.link))  # the link parsed once, here
        settings = EditSettings(self.prompt, self.steps, self.seed, self.policy, self.latency_target_s)
        object.__setattr__(self, "settings", settings)  # raises naming the bad value

    @property
    def source(self) -> ServerSource:
        return ServerSource(self.server_url, self.token, self.addresses)


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
    (:func:`fetch_template_manifest`, as the phone agent does when it admits a job): only the image is fetched."""
    if manifest is not None:
        opened = await open_checked_template(request.source, manifest)
    else:
        opened = await open_template(request.source, request.template_id, model)
    return await run_template_edit(
        model,
        opened,
        user_image,
        request.settings,
        link=request.link,
        profile=profile,
        cancel=cancel,
        on_layer=on_layer,
        backend=backend,
        prefetch_kv_bytes=prefetch_kv_bytes,
    )
