"""The NPU export (ONNX fp32 + w8a16 QDQ, and the QNN context binary on the emulated HTP when onnxruntime-qnn is
installed) works on the tiny latent klein transformer, as on the demo model."""

from __future__ import annotations

import pytest
from ci_deps import QNN_WHEELS, import_or_skip, in_ci

pytestmark = pytest.mark.slow


def test_export_of_the_latent_klein_transformer(tmp_path, klein_model):
    import_or_skip("onnx", "onnx is not installed (pip install 'sakura-kv[npu]')")
    import_or_skip("onnxruntime", "onnxruntime is not installed (pip install 'sakura-kv[npu]')")
    from android_bridge.export import ExportConfig, export_demo
    from android_bridge.qnn import qnn_available

    qnn, why = qnn_available()
    if not qnn and QNN_WHEELS and in_ci():  # outside CI the ONNX-only export still runs
        pytest.fail(f"CI=true and {why}: CI installs onnxruntime-qnn, so the export must reach the HTP", pytrace=False)
    target = "qnn" if qnn else "onnx"
    config = ExportConfig(out_dir=tmp_path / "export", target=target, calibration_steps=2, validation_steps=2)
    report = export_demo(config, model=klein_model)
    assert report["model"]["model_id"] == klein_model.model_id
    assert report["shapes"]["image_tokens"] == klein_model.spec.num_tokens == 16
    parity = report["parity"]
    assert parity["onnx_fp32_cpu_vs_torch"]["rel_l2"] < 1e-5  # the graph is the adapter's cached-KV forward
    assert parity["w8a16_qdq_cpu_vs_torch"]["rel_l2"] < 0.2  # 8-bit weights, 16-bit activations
    if target == "qnn":
        assert report["qnn"]["compiled"] and report["qnn"]["op_coverage"] == 1.0  # whole graph on the HTP
        assert not report["qnn"]["nodes_outside_qnn"]
