"""onnxruntime + QNN execution provider (the emulated Hexagon HTP): availability, strict sessions with CPU
fallback disabled, graph checks, op coverage of compiled contexts, and the one w8a16 quantisation recipe (the
calibration edits, input ranges, onnxruntime's QNN QDQ quantiser) that the demo export and the QNN backend share."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

__all__ = [
    "CALIBRATION_EDITS",
    "INPUT_RANGE_MARGIN",
    "QNN_EP",
    "VALIDATION_EDIT",
    "ExportError",
    "check_graph",
    "ctx_coverage",
    "graph_feeds",
    "op_counts",
    "qnn_available",
    "qnn_session",
    "quantize_w8a16",
    "w8a16_bounds",
]

QNN_EP = "QNNExecutionProvider"


class ExportError(RuntimeError):
    """An export step failed (names the step and what to install or change)."""


def graph_feeds(names: list[str], inputs) -> dict[str, np.ndarray]:
    """ORT feeds: graph input ``names[i]`` -> ``inputs[i]`` (a torch tensor) as float32."""
    return {n: t.detach().numpy().astype(np.float32) for n, t in zip(names, inputs, strict=True)}


# ---- onnxruntime / QNN --------------------------------------------------------------------------------------------
def qnn_available() -> tuple[bool, str]:
    """(True, version) when onnxruntime-qnn and a plugin-capable onnxruntime are installed, else (False, why)."""
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as e:
        return False, f"onnxruntime-qnn is not installed ({e}); pip install 'sakura-kv[npu]'"
    if not hasattr(ort, "register_execution_provider_library"):
        return False, f"onnxruntime {ort.__version__} has no plugin EP API; onnxruntime-qnn 2.x needs >= 1.24.2"
    return True, f"onnxruntime {ort.__version__}, onnxruntime-qnn {onnxruntime_qnn.__version__}"


def _qnn_devices():
    import onnxruntime as ort
    import onnxruntime_qnn

    devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        ort.register_execution_provider_library(QNN_EP, onnxruntime_qnn.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        raise ExportError("onnxruntime-qnn registered no QNN device")
    return devices


def qnn_session(
    model_path: Path,
    *,
    soc_model: str = "69",
    strict: bool = True,
    context_path: Path | None = None,
    extra_options: dict | None = None,
):
    """An ORT session on the QNN HTP backend. ``strict`` disables CPU fallback (every node must run on the HTP);
    ``context_path`` also writes the compiled context binary (embed mode 0: the graph blob sits beside it)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if strict:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if context_path is not None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(context_path))
        so.add_session_config_entry("ep.context_embed_mode", "0")
    options = {"backend_type": "htp", "soc_model": str(soc_model), **(extra_options or {})}
    so.add_provider_for_devices(_qnn_devices(), options)
    return ort.InferenceSession(str(model_path), so)


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def check_graph(path: Path) -> None:
    """Refuse (:class:`ExportError`) what QNN cannot take: single-input Einsum, dynamic shapes, float64 I/O."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "Einsum" and len(node.input) == 1:
            raise ExportError(
                f"node {node.name}: a single-input Einsum, which QNN does not take; use reshape/transpose"
            )
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            raise ExportError(f"graph {vi.name} has a dynamic dimension; the NPU export needs static shapes")
        if vi.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE:
            raise ExportError(f"graph {vi.name} is float64; compute RoPE/timestep inputs in fp32")


def ctx_coverage(ctx_path: Path) -> dict:
    """QNN partitions (EPContext nodes) of a compiled context model, and the nodes left outside them by op type."""
    import onnx

    ctx = onnx.load(str(ctx_path), load_external_data=False)
    counts = collections.Counter(n.op_type for n in ctx.graph.node)
    outside = {k: v for k, v in counts.items() if k != "EPContext"}
    return {"qnn_partitions": counts.get("EPContext", 0), "nodes_outside_qnn": outside}


# ---- w8a16 quantisation: weights uint8, activations uint16 ------------------------------------------------------
# calibration edits: (template, user image, prompt); validation uses a pair calibration never saw
CALIBRATION_EDITS = (("astronaut", "chelsea", "make it a watercolor"), ("coffee", "rocket", "put it on the table"))
VALIDATION_EDIT = ("rocket", "astronaut", "swap the background")
# calibrated input ranges are widened by this: other templates, prompts and lossy shards than calibration saw
INPUT_RANGE_MARGIN = 1.5


def w8a16_bounds(calib: list[dict[str, np.ndarray]], fixed: dict[str, float], margin: float = INPUT_RANGE_MARGIN):
    """Symmetric range (+-bound) per graph input of the calibration feeds: ``fixed[name]`` where the calibration set
    cannot bound a tensor (or the bound is known), else ``margin`` x the calibrated max |x|."""
    return {
        name: fixed[name] if name in fixed else margin * max(float(np.abs(f[name]).max()) for f in calib)
        for name in calib[0]
    }


class _Reader:
    """Calibration data reader over graph feeds."""

    def __init__(self, calib: list[dict[str, np.ndarray]]):
        self._it = iter(calib)

    def get_next(self):
        return next(self._it, None)


def quantize_w8a16(fp32: Path, qdq: Path, calib: list[dict[str, np.ndarray]], bounds: dict[str, float]) -> None:
    """Write ``qdq``, the w8a16 QDQ graph of ``fp32`` for the QNN HTP (onnxruntime's QNN preprocessing,
    ``get_qnn_qdq_config``, ``quantize``), calibrated on the ``calib`` feeds; every tensor named in ``bounds`` gets
    the fixed uint16 range +-bound (uint16 keeps the resolution: 16 / 65535 = 2.4e-4 for +-8)."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    overrides = {
        name: [{"quant_type": QuantType.QUInt16, "rmin": np.float32(-bound), "rmax": np.float32(bound)}]
        for name, bound in bounds.items()
    }
    pre = fp32.with_suffix(".pre.onnx")
    try:
        src = pre if qnn_preprocess_model(str(fp32), str(pre)) else fp32
        qcfg = get_qnn_qdq_config(
            str(src),
            _Reader(calib),
            activation_type=QuantType.QUInt16,
            weight_type=QuantType.QUInt8,
            init_overrides=overrides,
        )
        quantize(str(src), str(qdq), qcfg)
    finally:
        pre.unlink(missing_ok=True)
