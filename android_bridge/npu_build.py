"""Build (once per model) and open the QNN backend's per-layer context binaries.

``open_qnn_backend(model, QnnBuildConfig())`` exports every layer's template and cached-KV graph
(:mod:`android_bridge.npu_layers`) to ONNX (static shapes of the model's geometry, opset 21), compiles each into a
w8a16 QDQ graph (weights uint8, activations uint16, calibrated on the inputs every graph sees in real hybrid edits,
both KV modes) and into a QNN HTP context binary with CPU fallback disabled (``soc_model`` 69 = SM8750), checks op
coverage (every node inside the QNN partition) and per-graph parity against the torch modules on held-out edit
inputs, and caches the lot
in ``<cache_root>/<model_id[:16]>-<geometry>-<precision>-soc<soc>/`` with a ``build.json``. Later opens load the
context binaries from there (no export, no compile). The cache lives next to the user's models, never in the repo:
``$SAKURA_QNN_CACHE`` or ``~/.cache/sakura/qnn``.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .export import parity
from .qnn import (
    CALIBRATION_EDITS,
    VALIDATION_EDIT,
    ExportError,
    check_graph,
    ctx_coverage,
    op_counts,
    qnn_available,
    qnn_session,
    quantize_w8a16,
    w8a16_bounds,
)
from .qnn_backend import QnnBackend, SplitForward, TorchLayerRunner, graph_io

__all__ = ["CACHE_ENV", "QnnBuildConfig", "default_cache_root", "open_qnn_backend"]

logger = logging.getLogger(__name__)

CACHE_ENV = "SAKURA_QNN_CACHE"
_BUILD_VERSION = 2
# fp16 on the emulated HTP came back wrong for plain MatMuls / RMSNorms of these graphs (rel. L2 0.4-0.7 for some
# outputs, deterministic; see docs/phone.md); w8a16 QDQ is the mode that matches torch there.
_PRECISIONS: dict[str, dict[str, object]] = {"w8a16": {}}


def default_cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sakura" / "qnn")


@dataclass(frozen=True)
class QnnBuildConfig:
    """Attributes:
    cache_root: folder holding one sub-folder per (model id, geometry, precision, SoC); None = default_cache_root().
    soc_model: QNN ``soc_model`` (69 = SM8750 / Snapdragon 8 Elite).
    precision: "w8a16" (QDQ: weights uint8, activations uint16).
    opset: ONNX opset of the exported graphs.
    calibration_steps: denoising steps per calibration edit (each step gives every graph one sample).
    """

    cache_root: Path | None = None
    soc_model: str = "69"
    precision: str = "w8a16"
    opset: int = 21
    calibration_steps: int = 3

    def __post_init__(self) -> None:
        if self.precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {self.precision!r}")
        if not str(self.soc_model).isdigit():
            raise ValueError(f"soc_model must be a QNN SoC number such as '69' (SM8750), got {self.soc_model!r}")

    def folder(self, model) -> Path:
        spec = model.spec
        geo = f"t{spec.text_tokens}-i{spec.num_tokens}-r{spec.num_tokens}"
        root = Path(self.cache_root) if self.cache_root is not None else default_cache_root()
        return root / f"{model.model_id[:16]}-{geo}-{self.precision}-soc{self.soc_model}"


def _graphs(model):
    a = model.adapter
    for layer in range(a.num_layers):
        for kind in ("template", "cached"):
            yield layer, kind


def _record_feeds(model, pairs, steps: int) -> dict[tuple[int, str], list[dict]]:
    """Every layer graph's inputs in real hybrid edits (template computed at every layer, then cached-KV): at every
    step once with the template at its fixed time (``single``) and once at the step's own time (``per-step``)."""
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.schedule import edit_times

    torch_runner = TorchLayerRunner(model)
    feeds: dict[tuple[int, str], list[dict[str, np.ndarray]]] = {}

    def record(layer: int, kind: str, f: dict) -> list[np.ndarray]:
        feeds.setdefault((layer, kind), []).append({k: v.copy() for k, v in f.items()})
        return torch_runner(layer, kind, f)

    split, spec, L = SplitForward(model, record), model.spec, model.adapter.num_layers
    for i, (template, user, prompt) in enumerate(pairs):
        ref = model.template_tokens(load_image(template, spec.image_size))
        packed, txt = model.pack_image(load_image(user, spec.image_size)), model.encode_prompt(prompt)
        x = torch.randn(packed.shape, generator=torch.Generator().manual_seed(i))
        times = edit_times(model, steps)
        for step in range(steps):
            t = times[step].reshape(1)
            for ref_t in (None, float(t)):  # single mode (the fixed template time), per-step (the step's own)
                out = split.forward(
                    model.request_tokens(x, packed),
                    txt,
                    t,
                    img_grid=spec.grid,
                    ref_tokens=ref,
                    ref_grid=spec.grid,
                    split_layer=L,
                    ref_timestep=ref_t,
                )
            x = x + (times[step + 1] - times[step]) * out.sample
    return feeds


def _quantize(fp32: Path, qdq: Path, calib: list[dict]) -> None:
    """w8a16 QDQ of one layer graph: RoPE tables fixed to +-1, the other inputs their calibrated range x the margin."""
    fixed = {name: 1.0 for name in calib[0] if name.endswith(("_cos", "_sin"))}
    quantize_w8a16(fp32, qdq, calib, w8a16_bounds(calib, fixed))


def _export(module, feeds: dict, out_names: list[str], path: Path, opset: int) -> None:
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    try:
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(feeds),
            output_names=out_names,
            dynamo=True,
            opset_version=opset,
            external_data=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001 - the exporter raises many types; name the graph
        raise ExportError(f"torch.onnx.export of {path.name} failed: {e}") from e
    check_graph(path)


def _build_one(model, runner, layer, kind, folder: Path, config: QnnBuildConfig, calib: list[dict]) -> dict:
    """Export, quantize, compile and check one layer graph; returns its row of the build report."""
    _, out_names = graph_io(model, layer, kind)
    name = f"layer{layer}_{kind}"
    onnx_path, qdq, ctx = folder / f"{name}.onnx", folder / f"{name}.w8a16.onnx", folder / f"{name}.qnn_ctx.onnx"
    t0 = time.perf_counter()
    _export(runner.graphs[(layer, kind)], calib[0], out_names, onnx_path, config.opset)
    _quantize(onnx_path, qdq, calib)
    t1 = time.perf_counter()
    options = _PRECISIONS[config.precision]
    try:
        qnn_session(qdq, soc_model=config.soc_model, strict=True, context_path=ctx, extra_options=options)
    except Exception as e:  # noqa: BLE001 - ORT raises its own Fail types; name the graph and the rule
        raise ExportError(f"the QNN HTP did not take {name} whole (CPU fallback disabled): {str(e)[:500]}") from e
    t2 = time.perf_counter()
    ops = {k: v for k, v in op_counts(onnx_path).items()}
    coverage = ctx_coverage(ctx)
    n_out = sum(coverage["nodes_outside_qnn"].values())
    onnx_path.unlink()  # the context model + its .bin are what runs
    qdq.unlink()
    return {
        "graph": name,
        "layer": layer,
        "kind": kind,
        "context_model": ctx.name,
        "nodes": sum(ops.values()),
        "nodes_outside_qnn": n_out,
        "qnn_partitions": coverage["qnn_partitions"],
        "export_s": round(t1 - t0, 2),
        "compile_s": round(t2 - t1, 2),
    }


def _parity_rows(model, runner, sessions: dict, held_out: dict) -> list[dict]:
    """Each graph on the HTP vs its torch module, on the inputs of a held-out edit (template, image and prompt that
    calibration never saw); the worst output and sample, and the mean emulated HTP seconds per call."""
    rows = []
    for layer, kind in _graphs(model):
        worst, times = None, []
        for feeds in held_out[(layer, kind)]:
            ref = runner(layer, kind, feeds)
            t0 = time.perf_counter()
            got = sessions[(layer, kind)].run(None, feeds)
            times.append(time.perf_counter() - t0)
            for g, r in zip(got, ref, strict=True):
                p = parity(g, r)
                worst = p if worst is None or p["rel_l2"] > worst["rel_l2"] else worst
        assert worst is not None  # every graph has held-out inputs
        rows.append({"graph": f"layer{layer}_{kind}", "emulated_htp_s": round(float(np.mean(times)), 4), **worst})
    return rows


def _open_sessions(model, folder: Path, config: QnnBuildConfig) -> dict:
    options = _PRECISIONS[config.precision]
    return {
        (layer, kind): qnn_session(
            folder / f"layer{layer}_{kind}.qnn_ctx.onnx",
            soc_model=config.soc_model,
            strict=True,
            extra_options=options,
        )
        for layer, kind in _graphs(model)
    }


def open_qnn_backend(model, config: QnnBuildConfig | None = None) -> QnnBackend:
    """The QNN backend of ``model``: builds the context binaries on first use (minutes on the emulator), then loads
    them from the cache. Raises :class:`ExportError` naming what is missing or what the HTP refused."""
    config = config or QnnBuildConfig()
    ok, why = qnn_available()
    if not ok:
        raise ExportError(f"--backend qnn needs onnxruntime-qnn: {why}")
    folder = config.folder(model)
    report_path = folder / "build.json"
    build = json.loads(report_path.read_text()) if report_path.is_file() else None
    if build is not None and (build.get("version") != _BUILD_VERSION or build.get("model_id") != model.model_id):
        build = None
    t0 = time.perf_counter()
    if build is None:
        build, sessions = _build(model, TorchLayerRunner(model), folder, config, why)
    else:
        sessions = _open_sessions(model, folder, config)
    build["load_s"] = round(time.perf_counter() - t0, 2)
    build["cache_dir"] = str(folder)
    logger.info("QNN backend: %d layer graphs loaded from %s in %.1f s", len(sessions), folder, build["load_s"])
    return QnnBackend(model, sessions, build)


def _build(model, runner, folder: Path, config: QnnBuildConfig, toolchain: str) -> tuple[dict, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("layer*"):
        stale.unlink()
    logger.info("QNN backend: building %d layer graphs into %s (once per model)", 2 * model.adapter.num_layers, folder)
    calib = _record_feeds(model, CALIBRATION_EDITS, config.calibration_steps)
    rows = [
        _build_one(model, runner, layer, kind, folder, config, calib[(layer, kind)]) for layer, kind in _graphs(model)
    ]
    nodes, outside = sum(r["nodes"] for r in rows), sum(r["nodes_outside_qnn"] for r in rows)
    sessions = _open_sessions(model, folder, config)
    build = {
        "version": _BUILD_VERSION,
        "model_id": model.model_id,
        "toolchain": toolchain,
        "soc_model": config.soc_model,
        "precision": config.precision,
        "emulated": platform.machine().lower() in ("x86_64", "amd64"),
        "graphs": rows,
        "op_coverage": {
            "nodes": nodes,
            "nodes_on_htp": nodes - outside,
            "fraction_on_htp": (nodes - outside) / nodes,
            "cpu_fallback": "disabled",
        },
        "parity_vs_torch": _parity_rows(model, runner, sessions, _record_feeds(model, [VALIDATION_EDIT], 2)),
    }
    (folder / "build.json").write_text(json.dumps(build, indent=1))
    return build, sessions
