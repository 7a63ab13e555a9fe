"""NPU export: the export graph computes what the KV adapter computes; the graph checks refuse what QNN cannot take;
and the NPU gate (marker ``npu``): the demo DiT compiles to a QNN context binary and runs fully on the emulated
Hexagon HTP with CPU fallback disabled, close to torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ci_deps import QNN_WHEELS, import_or_skip, require_or_skip

from android_bridge.npu_graph import CachedKVGraph, graph_input_names, graph_inputs


@pytest.fixture(scope="module")
def step_inputs(demo_model):
    from sakura_core.models.edit_model import load_image

    m = demo_model
    kv = m.adapter.extract_template_kv(m.template_tokens(load_image("coffee", m.spec.image_size)), m.spec.grid)
    g = torch.Generator().manual_seed(3)
    x = m.request_tokens(
        torch.randn(1, m.spec.num_tokens, m.spec.patch_dim, generator=g),
        m.pack_image(load_image("chelsea", m.spec.image_size)),
    )
    return x, m.encode_prompt("a red hat"), torch.tensor([0.6]), kv


def test_export_graph_matches_the_kv_adapter(demo_model, step_inputs):
    m = demo_model
    x, txt, t, kv = step_inputs
    ref = m.adapter.forward(x, txt, t, img_grid=m.spec.grid, ref_grid=m.spec.grid, cached=kv).sample
    graph = CachedKVGraph(m.adapter, m.spec.text_tokens, m.spec.num_tokens, m.spec.num_tokens).eval()
    inputs = graph_inputs(m, x, txt, t, kv)
    assert len(inputs) == len(graph_input_names(m.adapter.num_layers)) == 5 + 2 * m.adapter.num_layers
    assert all(i.dtype == torch.float32 for i in inputs)  # no float64 reaches the graph
    with torch.no_grad():
        out = graph(*inputs)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item())
    other = kv.kv.clone()
    other[-1] += 0.5  # the template K/V inputs are really used: change the last layer's, the output changes
    from sakura_core.models.kv_types import TemplateKV

    moved = TemplateKV(other, kv.model_id, kv.token_grid, kv.rope_layout)
    with torch.no_grad():
        assert (graph(*graph_inputs(m, x, txt, t, moved)) - out).abs().max().item() > 1e-3
    with pytest.raises(ValueError, match="template K/V inputs"):
        graph(*inputs[:-1])


def test_w8a16_bounds_fix_what_calibration_cannot_bound_and_widen_the_rest():
    from android_bridge.qnn import INPUT_RANGE_MARGIN, w8a16_bounds

    calib = [
        {"x": np.array([0.5, -3.0], np.float32), "k": np.array([1.0, -2.0], np.float32)},
        {"x": np.array([1.0], np.float32), "k": np.array([-4.0], np.float32)},
    ]
    assert INPUT_RANGE_MARGIN == 1.5
    assert w8a16_bounds(calib, {"x": 8.0, "velocity": 8.0}) == {"x": 8.0, "k": 6.0}  # 1.5 x max |k| = 1.5 x 4
    assert w8a16_bounds(calib, {}, margin=2.0) == {"x": 6.0, "k": 8.0}


def test_quantize_w8a16_gives_uint8_weights_uint16_activations_and_the_fixed_range(tmp_path):
    """The one quantisation recipe (the export's and the QNN backend's) on a two-branch graph b = a @ w, e = c @ w:
    input ``a``'s fixed +-8 range becomes a uint16 scale of 16 / 65535 around 32768; ``c`` (calibrated) and both
    outputs are uint16 too, ``w`` uint8; the preprocessed temp file is gone."""
    onnx = import_or_skip("onnx", "onnx is not installed (pip install 'sakura-kv[npu]')")
    import_or_skip("onnxruntime", "onnxruntime is not installed (pip install 'sakura-kv[npu]')")
    from onnx import TensorProto, helper, numpy_helper

    from android_bridge.qnn import quantize_w8a16

    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "w")
    nodes = [helper.make_node("MatMul", ["a", "w"], ["b"]), helper.make_node("MatMul", ["c", "w"], ["e"])]
    g = helper.make_graph(
        nodes, "g", [info("a", [2, 3]), info("c", [2, 3])], [info("b", [2, 4]), info("e", [2, 4])], [w]
    )
    fp32, qdq = tmp_path / "g.onnx", tmp_path / "g.w8a16.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(fp32))
    rng = np.random.default_rng(0)
    calib = [
        {"a": rng.uniform(-1, 1, (2, 3)).astype(np.float32), "c": rng.uniform(-2, 2, (2, 3)).astype(np.float32)}
        for _ in range(4)
    ]
    quantize_w8a16(fp32, qdq, calib, {"a": 8.0})
    model = onnx.load(str(qdq))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quant = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    scale, zero = inits[quant["a"].input[1]], inits[quant["a"].input[2]]
    assert zero.dtype == np.uint16 and int(zero) == 32768 and float(scale) == pytest.approx(16 / 65535, rel=1e-4)
    assert quant.keys() >= {"a", "c"} and all(inits[n.input[2]].dtype == np.uint16 for n in quant.values())
    dq_w = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits)
    assert inits[dq_w.input[0]].dtype == np.uint8 and inits[dq_w.input[0]].shape == (3, 4)  # the weight, uint8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.onnx", "g.w8a16.onnx"]


def test_graph_checks_refuse_single_input_einsum_dynamic_shapes_and_float64(tmp_path):
    onnx = import_or_skip("onnx", "onnx is not installed (pip install 'sakura-kv[npu]')")
    from onnx import TensorProto, helper

    from android_bridge.export import ExportError
    from android_bridge.qnn import check_graph

    def save(node, in_type=TensorProto.FLOAT, dims=(2, 3)):
        g = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("a", in_type, list(dims))],
            [helper.make_tensor_value_info("b", in_type, None)],
        )
        path = tmp_path / f"{node.op_type}-{in_type}-{dims}.onnx"
        onnx.save(helper.make_model(g), str(path))
        return path

    with pytest.raises(ExportError, match="single-input Einsum"):
        check_graph(save(helper.make_node("Einsum", ["a"], ["b"], equation="ij->ji")))
    with pytest.raises(ExportError, match="dynamic dimension"):
        check_graph(save(helper.make_node("Relu", ["a"], ["b"]), dims=("n", 3)))
    with pytest.raises(ExportError, match="float64"):
        check_graph(save(helper.make_node("Relu", ["a"], ["b"]), in_type=TensorProto.DOUBLE))


@pytest.mark.npu
def test_npu_gate_demo_dit_runs_fully_on_the_emulated_htp(tmp_path, capsys, record_property):
    from android_bridge.qnn import qnn_available

    require_or_skip(*qnn_available(), ci_installs=QNN_WHEELS)
    from sakura_core.cli import main

    out = tmp_path / "npu"
    threads = torch.get_num_threads()
    try:
        rc = main(
            ["export", "--target", "qnn", "--out", str(out), "--calibration-steps", "2", "--validation-steps", "2"]
        )
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads((out / "export_report.json").read_text())
    q, p = report["qnn"], report["parity"]
    # the whole graph is one QNN partition on the HTP; nothing fell back to the CPU (fallback was disabled anyway)
    assert q["compiled"] and q["cpu_fallback"] == "disabled" and q["soc_model"] == "69"
    assert q["qnn_partitions"] >= 1 and q["nodes_outside_qnn"] == {} and q["op_coverage"] == 1.0
    assert q["context_binaries"] and all((out / name).stat().st_size > 0 for name in q["context_binaries"])
    assert "Einsum" not in report["ops_fp32"]
    assert p["onnx_fp32_cpu_vs_torch"]["max_abs"] < 1e-4
    assert p["qnn_htp_vs_torch"]["rel_l2"] < 0.05  # w8a16 on the emulated HTP: measured ~0.006
    assert p["qnn_htp_edit_psnr_db_vs_torch"] > 35.0  # a whole edit on the HTP vs torch: measured ~55 dB
    assert "op coverage 100.0%" in printed
    for key, value in (
        ("op_coverage", q["op_coverage"]),
        ("qnn_partitions", q["qnn_partitions"]),
        ("htp_max_abs", p["qnn_htp_vs_torch"]["max_abs"]),
        ("htp_rel_l2", p["qnn_htp_vs_torch"]["rel_l2"]),
        ("htp_edit_psnr_db", p["qnn_htp_edit_psnr_db_vs_torch"]),
    ):
        record_property(key, value)  # in the junit XML; the full numbers are in export_report.json
