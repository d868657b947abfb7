"""Per-row int8 matmuls (model_export/quantize_rows.py), run by ONNX Runtime's CPU provider.

- a row's result is bit-for-bit the same alone or beside a row 1000x larger (the batch rule's reason);
- the result is exactly the int8 arithmetic the module describes (a numpy copy of it in int64), also
  on inputs whose u8 x s8 pairs would overflow int16 with full-range weights: on CPUs without VNNI
  (AVX2's ``vpmaddubsw``) that is where 127-level weights go wrong;
- it stays near the fp32 product; a weight that other nodes read stays for them; opset < 21 is refused.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_export.quantize_rows import ACTIVATION_LEVELS, WEIGHT_LEVELS, quantize_rows

K, N = 64, 48


def _graph(weights: list[np.ndarray], opset: int = 21, gather_too: bool = False) -> onnx.ModelProto:
    """x (B, S, K) -> one MatMul per weight, each an output; optionally a Gather that reads weight 0."""
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(len(weights))]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(weights))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", K])]
    initializers = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]
    if gather_too:
        nodes.append(helper.make_node("Gather", ["w0", "ids"], ["rows"]))
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"]))
        outputs.append(helper.make_tensor_value_info("rows", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _exact(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The module's arithmetic in numpy: float32 scales, integer products in int64 (never saturate)."""
    largest = np.abs(weight).max(axis=0)
    w_scale = np.where(largest > 0, largest / WEIGHT_LEVELS, 1.0).astype(np.float32)
    wq = np.clip(np.rint(weight / w_scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int64)
    scale = np.maximum(
        np.abs(x).max(axis=-1, keepdims=True) * np.float32(1 / ACTIVATION_LEVELS), np.float32(1e-12)
    )
    q = np.clip(np.rint(x / scale), -ACTIVATION_LEVELS - 1, ACTIVATION_LEVELS).astype(np.int64)
    return ((q @ wq).astype(np.float32) * w_scale) * scale


def test_a_row_is_the_same_alone_or_beside_a_much_larger_row() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((K, N)).astype(np.float32) * 0.1
    model = _graph([weight])
    assert quantize_rows(model) == 1
    x = rng.standard_normal((3, 5, K)).astype(np.float32)
    x[1] *= 1000.0
    together = _run(model, {"x": x})[0]
    for row in range(3):
        alone = _run(model, {"x": x[row : row + 1]})[0]
        assert np.array_equal(together[row : row + 1], alone)
    # one scale per tensor (quantize_dynamic) would give row 0 row 1's scale, 1000x too coarse to
    # see it at all; here row 0 keeps its own precision
    fp32 = x[0] @ weight
    assert np.abs(together[0] - fp32).max() <= 0.03 * np.abs(fp32).max()


def test_the_result_is_the_exact_int8_arithmetic_even_where_int16_pairs_would_overflow() -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((K, N)).astype(np.float32)
    weight[:, :8] = np.abs(weight[:, :8]) + 1.0  # all positive columns: every pair of products adds up
    weight[:, 8:16] = -np.abs(weight[:, 8:16]) - 1.0
    x = rng.standard_normal((4, 3, K)).astype(np.float32)
    x[0, 0] = 1.0  # every element the row's maximum: uint8 255 (round(x / s) = 127, + 128)
    x[0, 1] = -1.0  # uint8 1
    x[1, 0, ::2] = 1.0  # 255 and 1 alternating
    x[1, 0, 1::2] = -1.0
    model = _graph([weight])
    quantize_rows(model)
    got = _run(model, {"x": x})[0]
    expected = _exact(x, weight)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # what 127-level weights would have summed in int16 on those rows: 255 x 127 x 2 > 32767
    assert 255 * 127 * 2 > np.iinfo(np.int16).max >= 255 * WEIGHT_LEVELS * 2


def test_it_stays_near_the_fp32_product_and_keeps_a_weight_other_nodes_read() -> None:
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal((K, N)).astype(np.float32) * 0.05 for _ in range(2)]
    model = _graph(weights, gather_too=True)
    assert quantize_rows(model) == 2
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and "MatMul" not in ops
    assert ops.count("QuantizeLinear") == 1  # both matmuls read x: it is quantized once
    names = {i.name for i in model.graph.initializer}
    assert "w0" in names and "w1" not in names  # w0 still feeds the Gather; w1 is gone
    x = rng.standard_normal((2, 7, K)).astype(np.float32)
    ids = np.array([0, 3], np.int64)
    y0, y1, rows = _run(model, {"x": x, "ids": ids})
    for y, w in ((y0, weights[0]), (y1, weights[1])):
        fp32 = x @ w
        assert np.abs(y - fp32).max() <= 0.03 * np.abs(fp32).max()  # 7-bit weights, 8-bit activations
    assert np.array_equal(rows, weights[0][ids])


def test_a_graph_below_opset_21_is_refused_untouched() -> None:
    model = _graph([np.ones((K, N), np.float32)], opset=18)
    before = model.SerializeToString()
    with pytest.raises(ValueError, match="opset 21"):
        quantize_rows(model)
    assert model.SerializeToString() == before
