"""Sakura Pipelined DiT Sampler: the private edit. The user image and prompt stay in this process; shards stream in
while the DiT runs (fetch, decode and compute overlapped), and the report says what was fetched, when and why."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from comfy_api.latest import io

from ._common import (
    CATEGORY,
    SakuraDevice,
    SakuraKVStream,
    SakuraModel,
    SakuraNodeError,
    image_from_comfy,
    image_to_comfy,
    start_async,
    wait_interruptible,
)
from ._stream import EditRun
from .saved_outputs import save_run_files

__all__ = ["MEASURED", "SakuraPipelinedSampler", "device_timings", "report_json", "timeline_image"]

MEASURED = "this machine (measured)"
_EMULATED = "emulated phone: "


def device_timings() -> list[str]:
    """The ``device_timing`` choices: this machine's measured times, or a phone profile's EMULATED ones."""
    from sakura_core.runtime.profiles import PROFILES

    return [MEASURED, *(f"{_EMULATED}{name}" for name in PROFILES)]


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"report value of type {type(value).__name__} is not JSON serialisable")


def report_json(report: dict) -> str:
    return json.dumps(report, indent=1, default=_json_default)


def timeline_image(report: dict) -> np.ndarray:
    """The run's fetch / decode / compute lanes as an (H, W, 3) uint8 plot."""
    from PIL import Image

    from sakura_core.runtime.timeline_plot import plot_timeline

    where = " on the phone" if report["executed_on"].get("kind") == "phone" else ""
    title = f"{report['template_id']}{where} — {report['summary']}"  # the summary names a trace by its basename
    with tempfile.TemporaryDirectory(prefix="sakura-timeline-") as tmp:
        path = Path(tmp, "timeline.png")
        try:
            plot_timeline(report["timeline"], path, title=title, decisions=report.get("decisions"))
        except ImportError as e:
            raise SakuraNodeError(
                f"the timeline plot needs matplotlib in ComfyUI's Python: pip install matplotlib ({e})"
            ) from e
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))


class SakuraPipelinedSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        from sakura_core.demo.edit_task import EDIT_PROMPT  # what the demo model was trained with

        return io.Schema(
            node_id="SakuraPipelinedSampler",
            display_name="Sakura Pipelined DiT Sampler",
            category=CATEGORY,
            description="Edits the image against the template on this machine: template KV shards stream in (as "
            "the fetch policy decides) while the DiT runs; the image and prompt never leave this process. The "
            "edited image has the model's size: the demo model edits 64x64.",
            inputs=[
                SakuraModel.Input("model", tooltip="The editing DiT (the one the template's KV was computed for)."),
                SakuraKVStream.Input("kv_stream", tooltip="From a Sakura Bandwidth-Adaptive Fetch."),
                io.Image.Input(
                    "image",
                    tooltip="The private user image (stays on this device); centre-cropped to a square and resized "
                    "to the model's size (the demo model: 64x64).",
                ),
                io.String.Input("prompt", default=EDIT_PROMPT, multiline=True, tooltip="Stays on this device."),
                io.Int.Input(
                    "steps",
                    default=8,
                    min=1,
                    max=200,
                    tooltip="Denoising steps; each runs every DiT layer once. A single-mode template's KV serves any "
                    "step count; a per-step template's only the steps it was precomputed for (the loader shows it).",
                ),
                io.Int.Input(
                    "seed",
                    default=0,
                    min=0,
                    max=2**31 - 1,
                    control_after_generate=True,
                    tooltip="Seed of the starting noise: the same seed, inputs and policy give the same image.",
                ),
                io.String.Input(
                    "save_prefix",
                    default="sakura/edit",
                    tooltip="The report (JSON) and timeline (PNG) are saved in ComfyUI's output folder as "
                    "<save_prefix>_report_<n>.json and <save_prefix>_timeline_<n>.png, n = the number a Save Image "
                    "node with the same filename_prefix gives the edited image. Empty = not saved.",
                ),
                io.Combo.Input(
                    "device_timing",
                    options=device_timings(),
                    default=MEASURED,
                    tooltip="Whose compute speed the edit runs at. 'this machine' = measured here (the demo model is "
                    "tiny: computing a layer here beats fetching it, so sakura computes). 'emulated phone: <profile>' "
                    "= EMULATED timing of that phone running a phone-class DiT: each layer is paced to the phone's "
                    "time and the emulated link to phone-size shards, so the policy faces a phone's trade-off; the "
                    "image is still this model's. Needs an emulated link (fixed Mbit/s or a trace).",
                ),
                SakuraDevice.Input(
                    "device", optional=True, tooltip="A Sakura Phone Device: the edit runs on the phone instead."
                ),
            ],
            outputs=[
                io.Image.Output(
                    "edited",
                    display_name="IMAGE",
                    tooltip="The edited image, at the model's size (the demo model edits 64x64 images).",
                ),
                io.String.Output(
                    "report",
                    display_name="report (JSON)",
                    tooltip="What was fetched, at which level, when and why; latency and bytes (JSON text).",
                ),
                io.Image.Output(
                    "timeline",
                    display_name="timeline",
                    tooltip="The run's fetch / decode / compute lanes over time, as an image.",
                ),
            ],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(
        cls,
        model,
        kv_stream,
        image,
        prompt: str,
        steps: int,
        seed: int,
        save_prefix: str,
        device_timing: str,
        device=None,
    ) -> io.NodeOutput:
        import comfy.utils

        from sakura_core.edit_settings import EditSettings
        from sakura_core.fetch.client import FetchError
        from sakura_core.limits import LimitError

        try:  # the edit's one settings object, validated before anything runs (a lone surrogate would fail later)
            settings = EditSettings(prompt, steps, seed, kv_stream.settings)
        except ValueError as e:
            widget = "'prompt'" if isinstance(e, LimitError) else "'steps' or 'seed'"
            raise SakuraNodeError(f"{e} (widget {widget})") from e
        user = image_from_comfy(image, "image")
        timing = cls._timing(device_timing, kv_stream, device)
        run = EditRun(steps, model.adapter.num_layers)
        bar = comfy.utils.ProgressBar(run.total, node_id=cls.hidden.unique_id)

        def tick() -> None:
            bar.update_absolute(min(run.layers_started, run.total), run.total)

        try:
            if device is not None:
                from .phone_device import run_on_phone

                edited, report = run_on_phone(device, kv_stream, user, settings, run=run, on_tick=tick)
            else:
                edited, report = cls._run_here(model, kv_stream, user, settings, run, tick, timing)
            bar.update_absolute(run.total, run.total)
        except (FetchError, ValueError) as e:
            raise SakuraNodeError(f"edit against template {kv_stream.template.template_id!r} failed: {e}") from e
        finally:
            run.reset()
        text, timeline = report_json(report), timeline_image(report)
        save_run_files(save_prefix, text, timeline)
        return io.NodeOutput(image_to_comfy(edited), text, image_to_comfy(timeline))

    @classmethod
    def _timing(cls, device_timing: str, kv_stream, device):
        """The EMULATED phone timing chosen (``sakura_core.runtime.emulated_device``), or None (measured here)."""
        if device_timing == MEASURED:
            return None
        if not device_timing.startswith(_EMULATED) or device_timing not in device_timings():
            raise SakuraNodeError(f"device_timing {device_timing!r} is not one of {', '.join(device_timings())}")
        if device is not None:
            raise SakuraNodeError(
                "device_timing emulates a phone on this machine, but a Sakura Phone Device is "
                f"connected (the phone has its own timing): set device_timing to {MEASURED!r} or "
                "disconnect the device"
            )
        if not kv_stream.settings.link.emulated:
            raise SakuraNodeError(
                f"device_timing {device_timing!r} needs an emulated link: set the fetch node's "
                "bandwidth to 'fixed Mbit/s' or 'trace file' (a live link's shards cannot be paced "
                "at phone scale)"
            )
        from sakura_core.runtime.emulated_device import EmulatedTiming

        return EmulatedTiming.for_manifest(device_timing[len(_EMULATED) :], kv_stream.template.manifest)

    @classmethod
    def _run_here(cls, model, kv_stream, user, settings, run, tick, timing=None):
        from sakura_core import edit
        from sakura_core.kv.manifest import ModelMismatchError

        opened = wait_interruptible(kv_stream.join())
        future = start_async(
            lambda: edit.run_template_edit(
                model, opened, user, settings, cancel=run.cancel, on_layer=run.on_layer, timing=timing
            ),
            name="sakura-edit",
        )
        try:
            outcome = wait_interruptible(future, on_tick=tick, on_interrupt=run.cancel.set)
        except ModelMismatchError as e:  # the one check that the model edits is the one the template was loaded for
            raise SakuraNodeError(f"{e} (in the graph: connect the same Sakura Model Loader to both nodes)") from e
        return outcome.image, outcome.report
