"""onnxruntime + QNN execution provider (the emulated Hexagon HTP): availability, strict sessions with CPU
fallback disabled, graph checks, op coverage of compiled contexts, and calibration data for w8a16 quantization."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

__all__ = ["QNN_EP", "ExportError", "qnn_available", "qnn_session"]

QNN_EP = "QNNExecutionProvider"


class ExportError(RuntimeError):
    """An export step failed (names the step and what to install or change)."""


def _feeds(names: list[str], inputs) -> dict[str, np.ndarray]:
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


def qnn_session(model_path: Path, *, soc_model: str = "69", strict: bool = True, context_path: Path | None = None,
                extra_options: dict | None = None):  # fmt: skip
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


def _op_counts(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def _check_graph(path: Path) -> None:
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


def _ctx_coverage(ctx_path: Path) -> dict:
    import onnx

    ctx = onnx.load(str(ctx_path), load_external_data=False)
    counts = collections.Counter(n.op_type for n in ctx.graph.node)
    outside = {k: v for k, v in counts.items() if k != "EPContext"}
    return {"qnn_partitions": counts.get("EPContext", 0), "nodes_outside_qnn": outside}


# Fixed quantization ranges where the calibration set cannot bound a tensor: the noisy latent (Gaussian noise beside an
# image in [-1, 1]) and the velocity (noise - image) are covered to +-8 sigma; the RoPE / timestep tables are exact.
# The prompt embedding and the template K/V (other templates than calibration saw) get a margin on the calibrated
# range. uint16 keeps the resolution: 16 / 65535 = 2.4e-4 for +-8.
_FIXED_RANGES = {"x": 8.0, "velocity": 8.0, "t_freq": 1.0, "rope_cos": 1.0, "rope_sin": 1.0}
_MARGIN = 1.5


def _range_overrides(names: list[str], calib: list) -> dict:
    from onnxruntime.quantization import QuantType

    overrides = {}
    for j, name in enumerate(names):
        if name in _FIXED_RANGES:
            bound = _FIXED_RANGES[name]
        else:
            bound = _MARGIN * max(float(s[j].abs().max()) for s in calib)
        overrides[name] = [{"quant_type": QuantType.QUInt16, "rmin": np.float32(-bound), "rmax": np.float32(bound)}]
    overrides["velocity"] = [{"quant_type": QuantType.QUInt16, "rmin": np.float32(-_FIXED_RANGES["velocity"]),
                              "rmax": np.float32(_FIXED_RANGES["velocity"])}]  # fmt: skip
    return overrides


class _Reader:
    """Calibration data reader over captured graph inputs."""

    def __init__(self, names: list[str], samples: list):
        self._it = iter([_feeds(names, s) for s in samples])

    def get_next(self):
        return next(self._it, None)
