"""NPU export of the demo DiT in cached-KV mode: ONNX (static shapes), w8a16 QDQ, QNN context binary, validation.

``export_demo(ExportConfig(out_dir, target))`` writes into ``out_dir``:

* ``dit_cached_kv.onnx`` — fp32 graph of :class:`~android_bridge.npu_graph.CachedKVGraph` (opset 21);
* ``dit_cached_kv.w8a16.onnx`` — QDQ graph: weights uint8, activations uint16 (``get_qnn_qdq_config``),
  calibrated on real denoising steps of demo edits (template K/V inputs get fixed calibrated encodings);
* with ``target="qnn"``: ``dit_cached_kv.w8a16.qnn_ctx.onnx`` + its ``*.bin`` — the QNN HTP context binary compiled
  ahead of time by ``onnxruntime-qnn`` for ``soc_model`` (69 = SM8750, Snapdragon 8 Elite) with CPU fallback
  disabled, then loaded again and run on the emulated HTP (the x86-64 ``libQnnHtp.so``);
* ``io.json`` (inputs, shapes, how to compute the outside-the-graph inputs) and ``export_report.json``.

The report gives op coverage (graph ops by type, QNN partitions, nodes left outside QNN) and numerical parity
against the torch model on held-out steps that calibration never saw: max abs error, max abs error relative to the
output's range, and relative L2 error, per backend (ORT CPU fp32, ORT CPU QDQ, QNN HTP), plus the PSNR of a whole
edit whose every step ran on the HTP against the same edit in torch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sakura_core.metrics import psnr_uint8

from .npu_graph import CachedKVGraph, graph_input_names, graph_inputs
from .qnn import (
    CALIBRATION_EDITS,
    VALIDATION_EDIT,
    ExportError,
    check_graph,
    ctx_coverage,
    graph_feeds,
    op_counts,
    qnn_available,
    qnn_session,
    quantize_w8a16,
    w8a16_bounds,
)

__all__ = ["ExportConfig", "ExportError", "export_demo", "parity", "qnn_available", "qnn_session"]

logger = logging.getLogger(__name__)

FP32_NAME = "dit_cached_kv.onnx"
QDQ_NAME = "dit_cached_kv.w8a16.onnx"
CTX_NAME = "dit_cached_kv.w8a16.qnn_ctx.onnx"
# Fixed ranges where the calibration set cannot bound a tensor: the noisy latent (Gaussian noise beside an image in
# [-1, 1]) and the velocity (noise - image) are covered to +-8 sigma; the RoPE / timestep tables are exact. The rest
# (the prompt embedding, the template K/V: other templates than calibration saw) get a margin on the calibrated range.
_FIXED_RANGES = {"x": 8.0, "velocity": 8.0, "t_freq": 1.0, "rope_cos": 1.0, "rope_sin": 1.0}


@dataclass(frozen=True)
class ExportConfig:
    """Attributes:
    out_dir: output folder (created).
    target: "onnx" (fp32 + w8a16 QDQ, validated on ORT CPU) or "qnn" (also the QNN context binary, validated
        on the emulated HTP with CPU fallback disabled).
    opset: ONNX opset (>= 21: native 16-bit QDQ).
    calibration_steps: denoising steps per calibration edit (each step is one calibration sample).
    validation_steps: denoising steps of the held-out edit (per-step parity, and the whole-edit PSNR on the HTP).
    soc_model: QNN ``soc_model`` (69 = SM8750 / Snapdragon 8 Elite).
    weights: demo model weights ("auto", "none" or a path).
    seed: noise seed of the calibration and validation edits.
    """

    out_dir: Path
    target: str = "qnn"
    opset: int = 21
    calibration_steps: int = 4
    validation_steps: int = 4
    soc_model: str = "69"
    weights: str = "auto"
    seed: int = 0
    extra_provider_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.target not in ("onnx", "qnn"):
            raise ValueError(f"target must be 'onnx' or 'qnn', got {self.target!r}")
        if self.opset < 21:
            raise ValueError(f"opset must be >= 21 (16-bit QDQ), got {self.opset}")
        if self.calibration_steps < 1 or self.validation_steps < 1:
            raise ValueError("calibration_steps and validation_steps must be >= 1")


# ---- numerics ---------------------------------------------------------------------------------------------------
def parity(got: np.ndarray, ref: np.ndarray) -> dict:
    """max abs error, max abs error / max|ref|, and ||got - ref|| / ||ref||."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    diff = got - ref
    return {
        "max_abs": float(np.abs(diff).max()),
        "max_abs_over_range": float(np.abs(diff).max() / max(np.abs(ref).max(), 1e-12)),
        "rel_l2": float(np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-12)),
    }


def _worst(rows: list[dict]) -> dict:
    return {k: max(r[k] for r in rows) for k in rows[0]} if rows else {}


# ---- samples ----------------------------------------------------------------------------------------------------
@torch.no_grad()
def _edit_samples(model, template_name: str, user_name: str, prompt: str, steps: int, seed: int, velocity=None):
    """Run a cached-KV edit; returns (per-step graph inputs, per-step torch velocities, final image).

    ``velocity(inputs) -> (1, tokens, out)`` replaces the torch model inside the loop when given (an NPU run)."""
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.schedule import edit_times

    a = model.adapter
    size = model.spec.image_size
    template, user = load_image(template_name, size), load_image(user_name, size)
    kv = a.extract_template_kv(model.template_tokens(template), model.spec.grid)
    packed, txt = model.pack_image(user), model.encode_prompt(prompt)
    x = torch.randn(packed.shape, generator=torch.Generator().manual_seed(seed))
    times = edit_times(model, steps)  # the edit's schedule: a latent model's own
    if hasattr(model, "edit_start"):  # a latent model: its own start (user latents + noise)
        x = model.edit_start(packed, x, steps)[0]
    inputs, outputs = [], []
    for step in range(steps):
        t, t_next = times[step], times[step + 1]
        tokens = model.request_tokens(x, packed)
        ins = graph_inputs(model, tokens, txt, t.reshape(1), kv)
        ref = a.forward(tokens, txt, t.reshape(1), img_grid=model.spec.grid, ref_grid=model.spec.grid, cached=kv)
        inputs.append(ins)
        outputs.append(ref.sample)
        v = ref.sample if velocity is None else torch.from_numpy(velocity(ins))
        x = x + (t_next - t) * v
    return inputs, outputs, model.unpack_tokens(x)


# ---- the export -----------------------------------------------------------------------------------------------
@dataclass
class _Samples:
    """Graph inputs of the calibration steps, and the held-out edit's steps (inputs, torch velocities, image)."""

    calib: list
    val_in: list
    val_out: list
    val_image: np.ndarray

    def parity_of(self, run: Callable[[tuple], np.ndarray]) -> list[dict]:
        """Per-step parity of ``run(inputs) -> velocity`` against torch on the held-out steps."""
        return [parity(run(i), o.numpy()) for i, o in zip(self.val_in, self.val_out, strict=True)]


def export_demo(config: ExportConfig, model=None, progress: Callable[[str], None] | None = None) -> dict:
    """Export, quantize, (compile,) validate; returns the report (also written to ``export_report.json``)."""
    import onnxruntime  # noqa: F401 - fail before the slow steps when the npu extra is missing

    say = progress or (lambda msg: logger.info("%s", msg))
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        from sakura_core.models.edit_model import load_demo_model

        model = load_demo_model(weights=None if config.weights == "none" else config.weights)
    a, spec = model.adapter, model.spec
    names = graph_input_names(a.num_layers)
    graph = CachedKVGraph(a, spec.text_tokens, spec.num_tokens, spec.num_tokens).eval()
    report = _base_report(model, config)
    samples = _collect_samples(model, graph, config, report, say)
    fp32 = _export_fp32(graph, names, samples, config, report, say)
    qdq = _quantize_w8a16(fp32, names, samples, config, report, say)
    if config.target == "qnn":
        _compile_and_validate_qnn(qdq, names, samples, model, config, report, say)
    _write(out, report, names, spec, a, model)
    return report


def _base_report(model, config: ExportConfig) -> dict:
    """The report's header: the model, the target and the graph's static shapes."""
    a, spec = model.adapter, model.spec
    return {
        "model": {
            "name": spec.name,
            "model_id": model.model_id,
            "weights": model.weights_source,
            "layers": a.num_layers,
            "heads": a.num_heads,
            "head_dim": a.head_dim,
            "params": sum(p.numel() for p in a.model.parameters()),
        },
        "target": config.target,
        "shapes": {
            "text_tokens": spec.text_tokens,
            "image_tokens": spec.num_tokens,
            "template_tokens": spec.num_tokens,
        },
        "timings_s": {},
    }


def _collect_samples(model, graph, config: ExportConfig, report: dict, say) -> _Samples:
    """Step 1: calibration samples from some edits, validation from a held-out one; checks the export graph."""
    t0 = time.perf_counter()
    calib = []
    for i, (tpl, user, prompt) in enumerate(CALIBRATION_EDITS):
        ins, _, _ = _edit_samples(model, tpl, user, prompt, config.calibration_steps, config.seed + i)
        calib += ins
    val_in, val_out, val_image = _edit_samples(model, *VALIDATION_EDIT, config.validation_steps, config.seed + 100)
    samples = _Samples(calib, val_in, val_out, val_image)
    with torch.no_grad():
        graph_err = _worst(samples.parity_of(lambda i: graph(*i).numpy()))
    report["parity"] = {"torch_export_graph_vs_torch": graph_err}
    report["timings_s"]["samples"] = round(time.perf_counter() - t0, 2)
    say(
        f"samples: {len(calib)} calibration, {len(val_in)} validation steps; export graph vs torch max abs "
        f"{graph_err['max_abs']:.2e}"
    )
    return samples


def _export_fp32(graph, names: list[str], samples: _Samples, config: ExportConfig, report: dict, say) -> Path:
    """Step 2: the fp32 ONNX graph, checked, with its parity on ORT CPU."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    fp32 = config.out_dir / FP32_NAME
    try:
        torch.onnx.export(
            graph,
            samples.calib[0],
            str(fp32),
            input_names=names,
            output_names=["velocity"],
            dynamo=True,
            opset_version=config.opset,
            external_data=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001 - the exporter raises many types; name the step
        raise ExportError(f"torch.onnx.export of the cached-KV graph failed: {e}") from e
    check_graph(fp32)
    report["timings_s"]["onnx_export"] = round(time.perf_counter() - t0, 2)
    report["ops_fp32"] = op_counts(fp32)
    cpu = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    report["parity"]["onnx_fp32_cpu_vs_torch"] = _worst(
        samples.parity_of(lambda i: cpu.run(None, graph_feeds(names, i))[0])
    )
    say(
        f"fp32 ONNX: {sum(report['ops_fp32'].values())} nodes; ORT CPU vs torch max abs "
        f"{report['parity']['onnx_fp32_cpu_vs_torch']['max_abs']:.2e}"
    )
    return fp32


def _quantize_w8a16(fp32: Path, names: list[str], samples: _Samples, config: ExportConfig, report: dict, say) -> Path:
    """Step 3: the w8a16 QDQ graph (calibrated on the samples), with its parity on ORT CPU."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    calib = [graph_feeds(names, s) for s in samples.calib]
    bounds = {**w8a16_bounds(calib, _FIXED_RANGES), "velocity": _FIXED_RANGES["velocity"]}  # + the output
    qdq = config.out_dir / QDQ_NAME
    quantize_w8a16(fp32, qdq, calib, bounds)
    report["timings_s"]["quantize"] = round(time.perf_counter() - t0, 2)
    ops_qdq = op_counts(qdq)
    report["ops_w8a16"] = ops_qdq
    cpu_q = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"])
    report["parity"]["w8a16_qdq_cpu_vs_torch"] = _worst(
        samples.parity_of(lambda i: cpu_q.run(None, graph_feeds(names, i))[0])
    )
    say(
        f"w8a16 QDQ: {sum(ops_qdq.values())} nodes; ORT CPU (simulated quantization) vs torch rel L2 "
        f"{report['parity']['w8a16_qdq_cpu_vs_torch']['rel_l2']:.3e}"
    )
    return qdq


def _compile_and_validate_qnn(qdq: Path, names, samples: _Samples, model, config: ExportConfig, report, say) -> None:
    """Step 4: the QNN context binary for the emulated HTP (CPU fallback disabled), its coverage and parity."""
    ok, why = qnn_available()
    if not ok:
        raise ExportError(why)
    report["toolchain"] = why
    ops_qdq = report["ops_w8a16"]
    compute_ops = {k: v for k, v in ops_qdq.items() if k not in ("QuantizeLinear", "DequantizeLinear")}
    out = config.out_dir
    ctx = out / CTX_NAME
    for stale in out.glob("dit_cached_kv.w8a16.qnn_ctx*"):
        stale.unlink()
    t0 = time.perf_counter()
    try:
        qnn_session(
            qdq, soc_model=config.soc_model, strict=True, context_path=ctx, extra_options=config.extra_provider_options
        )
    except Exception as e:  # noqa: BLE001 - ORT raises its own Fail types; find and report what did not fit
        report["qnn"] = {"compiled": False, "error": str(e)[:2000], **_permissive_coverage(qdq, config, out)}
        _write(out, report, names, model.spec, model.adapter, model)
        raise ExportError(
            f"the QNN HTP did not take the whole graph (CPU fallback disabled): {str(e)[:500]}; "
            f"see {out / 'export_report.json'}"
        ) from e
    report["timings_s"]["qnn_compile"] = round(time.perf_counter() - t0, 2)
    coverage = ctx_coverage(ctx)
    n_outside = sum(coverage["nodes_outside_qnn"].values())
    n_compute = sum(compute_ops.values())
    say(
        f"QNN context binary for soc_model {config.soc_model}: {coverage['qnn_partitions']} partition(s), "
        f"{n_outside} node(s) outside QNN"
    )
    _validate_on_htp(ctx, names, samples, model, config, report)
    report["qnn"] = {
        "compiled": True,
        "soc_model": config.soc_model,
        "cpu_fallback": "disabled",
        "context_model": ctx.name,
        "context_binaries": sorted(p.name for p in out.glob("dit_cached_kv.w8a16.qnn_ctx*.bin")),
        "compute_nodes": n_compute,
        "compute_ops": compute_ops,
        **coverage,
        "op_coverage": (n_compute - n_outside) / n_compute if n_compute else 0.0,
        "emulated": "x86-64 libQnnHtp.so (HTP emulation): numerics, not phone timing",
    }
    say(
        f"QNN HTP vs torch: max abs {report['parity']['qnn_htp_vs_torch']['max_abs']:.3e}, rel L2 "
        f"{report['parity']['qnn_htp_vs_torch']['rel_l2']:.3e}; whole-edit PSNR "
        f"{report['parity']['qnn_htp_edit_psnr_db_vs_torch']} dB"
    )


def _validate_on_htp(ctx: Path, names, samples: _Samples, model, config: ExportConfig, report: dict) -> None:
    """Load the context binary on the emulated HTP: per-step parity, and a whole edit with every step on it."""
    t0 = time.perf_counter()
    htp = qnn_session(ctx, soc_model=config.soc_model, strict=True, extra_options=config.extra_provider_options)
    report["timings_s"]["qnn_load_context"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    per_step = samples.parity_of(lambda i: htp.run(None, graph_feeds(names, i))[0])
    run_s = (time.perf_counter() - t0) / len(samples.val_in)
    report["timings_s"]["qnn_emulated_run_per_step"] = round(run_s, 3)
    report["parity"]["qnn_htp_vs_torch"] = _worst(per_step)
    report["parity"]["qnn_htp_vs_torch_per_step"] = per_step
    # a whole edit with every step on the HTP, against the same edit in torch
    _, _, htp_image = _edit_samples(
        model,
        *VALIDATION_EDIT,
        config.validation_steps,
        config.seed + 100,
        velocity=lambda ins: htp.run(None, graph_feeds(names, ins))[0],
    )
    report["parity"]["qnn_htp_edit_psnr_db_vs_torch"] = round(psnr_uint8(htp_image, samples.val_image), 2)


def _permissive_coverage(qdq: Path, config: ExportConfig, out: Path) -> dict:
    """With CPU fallback allowed, which nodes stay outside QNN (for the report of a failed strict compile)."""
    probe = out / "coverage_probe_ctx.onnx"
    try:
        qnn_session(
            qdq,
            soc_model=config.soc_model,
            strict=False,
            context_path=probe,
            extra_options=config.extra_provider_options,
        )
        return ctx_coverage(probe)
    except Exception as e:  # noqa: BLE001 - best effort: the strict error is reported either way
        return {"coverage_probe_error": str(e)[:1000]}
    finally:
        for p in out.glob("coverage_probe_ctx*"):
            p.unlink()


def _write(out: Path, report: dict, names: list[str], spec, adapter, model) -> None:
    io_spec = {
        "inputs": {
            "x": [1, spec.num_tokens, adapter.model.config.in_channels],
            "txt": [1, spec.text_tokens, adapter.model.config.joint_attention_dim],
            "t_freq": [1, adapter.model.config.timestep_guidance_channels],
            "rope_cos": [spec.text_tokens + spec.num_tokens, adapter.head_dim],
            "rope_sin": [spec.text_tokens + spec.num_tokens, adapter.head_dim],
            **{n: [1, spec.num_tokens, adapter.num_heads, adapter.head_dim] for n in names[5:]},
        },
        "outputs": {"velocity": [1, spec.num_tokens, adapter.model.config.out_channels]},
        "dtype": "float32 at the graph boundary (the QDQ graph quantizes inside)",
        "outside_the_graph": {
            "t_freq": "time_guidance_embed.time_proj(timestep * 1000), fp32",
            "rope_cos/rope_sin": "pos_embed of text ids then image ids (flux2 layout), fp32",
            "k_ref_l/v_ref_l": "template K/V of layer l after RoPE, (1, tokens, heads, head_dim) — a decoded shard",
        },
        "model_id": model.model_id,
    }
    (out / "io.json").write_text(json.dumps(io_spec, indent=1))
    (out / "export_report.json").write_text(json.dumps(report, indent=1, default=str))
