"""Int8 weight matmuls whose rows do not depend on their batch: one activation scale per row.

ONNX Runtime's ``quantize_dynamic`` quantizes a MatMul's input with ``DynamicQuantizeLinear``: one
scale and zero point for the whole tensor, so a row's result depends on the largest value anywhere
in its batch (up to 0.11 on a classifier's logits), which the service's contract (a batched answer
equals the answer alone) refuses. Here every MatMul ``x @ W`` with a constant 2-D ``W`` (K, N) becomes

    s  = max(|x|) over the last axis / 127                        (..., 1): one scale per row
    q  = QuantizeLinear(x, s, 128, axis=-1, block_size=K)         uint8: round(x / s) + 128
    y  = MatMulIntegerToFloat(q, Wq, s, w_scale, 128)             (q - 128) @ Wq * w_scale * s

with ``Wq`` the weights in int8 per output column (symmetric, ``w_scale = max|W[:, n]| / 64``). A row's
scale is computed from that row alone, and its integer products are exact, so its result is the same
whatever shares its batch (``variants.batch_difference`` measures 0).

Why 64 levels for the weights, not 127: ONNX Runtime's u8 x s8 kernel on CPUs without VNNI (AVX2)
multiplies with ``vpmaddubsw``, which adds pairs of products in int16 and saturates past 32,767;
255 x 127 x 2 overflows it (measured here: 99.9% of an AVX2 CPU's uniform random products wrong), and
255 x 64 x 2 = 32,640 never does. So the integer products are exact on every CPU, as on VNNI ones.
This is ONNX Runtime's own ``reduce_range`` advice for such CPUs, kept per output column.

``MatMulIntegerToFloat`` (ONNX Runtime's contrib op, CPU) multiplies its output by a non-scalar
``a_scale`` with broadcasting after the integer GEMM; its ``bias`` input is left out, as a bias added
before that scaling would be scaled too. ``QuantizeLinear`` with ``block_size`` needs opset 21.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHT_LEVELS = 64  # |Wq| <= 64: see the module docstring
ACTIVATION_LEVELS = 127
ACTIVATION_ZERO_POINT = 128  # uint8: q = round(x / s) + 128 in [1, 255]
MIN_OPSET = 21  # blocked QuantizeLinear
MS_DOMAIN = "com.microsoft"


def _opset(model: onnx.ModelProto, domain: str = "") -> int:
    names = {domain} if domain else {"", "ai.onnx"}
    return next((o.version for o in model.opset_import if o.domain in names), 0)


def _weights(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 weights per output column and their float scales: ``W ~ Wq * scale``."""
    largest = np.abs(weight).max(axis=0)
    scale = np.where(largest > 0, largest / WEIGHT_LEVELS, 1.0).astype(np.float32)
    quantized = np.clip(np.rint(weight / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return quantized, scale


def quantize_rows(model: onnx.ModelProto) -> int:
    """Rewrite every MatMul with a constant 2-D float weight in ``model`` (in place); returns how many.

    Raises ValueError when the graph's opset is below 21 (nothing is rewritten then).
    """
    if _opset(model) < MIN_OPSET:
        raise ValueError(f"per-row quantization needs opset {MIN_OPSET} (QuantizeLinear with block_size)")
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    zero_point = "int8_rows_zero_point"
    quantized_inputs: dict[str, tuple[str, str]] = {}  # x -> (q, s)
    quantized_weights: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    dropped: set[str] = set()
    rewritten = 0
    for node in graph.node:
        weight = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or weight.data_type != TensorProto.FLOAT or len(weight.dims) != 2:
            nodes.append(node)
            continue
        x, k = node.input[0], int(weight.dims[0])
        if x not in quantized_inputs:
            tag = f"int8_rows_{len(quantized_inputs)}"
            q, s = f"{tag}_q", f"{tag}_scale"
            nodes += [
                helper.make_node("Abs", [x], [f"{tag}_abs"], name=f"{tag}_abs"),
                helper.make_node(
                    "ReduceMax",
                    [f"{tag}_abs", "int8_rows_last_axis"],
                    [f"{tag}_max"],
                    keepdims=1,
                    name=f"{tag}_max",
                ),
                helper.make_node(
                    "Mul",
                    [f"{tag}_max", "int8_rows_per_level"],
                    [f"{tag}_raw_scale"],
                    name=f"{tag}_per_level",
                ),
                helper.make_node(
                    "Max", [f"{tag}_raw_scale", "int8_rows_smallest_scale"], [s], name=f"{tag}_scale"
                ),
                helper.make_node("Shape", [s], [f"{tag}_shape"], name=f"{tag}_shape"),
                helper.make_node(
                    "Expand", [zero_point, f"{tag}_shape"], [f"{tag}_zero_points"], name=f"{tag}_zero_points"
                ),
                helper.make_node(
                    "QuantizeLinear",
                    [x, s, f"{tag}_zero_points"],
                    [q],
                    axis=-1,
                    block_size=k,
                    name=f"{tag}_quantize",
                ),
            ]
            quantized_inputs[x] = (q, s)
        q, s = quantized_inputs[x]
        prefix = weight.name
        if prefix not in quantized_weights:  # one int8 copy of a weight that several MatMuls read
            wq, w_scale = _weights(numpy_helper.to_array(weight))
            graph.initializer.extend(
                [
                    numpy_helper.from_array(wq, f"{prefix}_int8"),
                    numpy_helper.from_array(w_scale, f"{prefix}_int8_scale"),
                ]
            )
            quantized_weights.add(prefix)
        nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [q, f"{prefix}_int8", s, f"{prefix}_int8_scale", zero_point],
                list(node.output),
                name=f"{node.name or prefix}_int8",
                domain=MS_DOMAIN,
            )
        )
        readers[weight.name] -= 1
        if readers[weight.name] == 0:
            dropped.add(weight.name)
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [i for i in graph.initializer if i.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if rewritten:
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array(ACTIVATION_ZERO_POINT, np.uint8), zero_point),
                numpy_helper.from_array(np.array([-1], np.int64), "int8_rows_last_axis"),
                numpy_helper.from_array(np.array(1.0 / ACTIVATION_LEVELS, np.float32), "int8_rows_per_level"),
                numpy_helper.from_array(np.array(1e-12, np.float32), "int8_rows_smallest_scale"),
            ]
        )
        if _opset(model, MS_DOMAIN) == 0:
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return rewritten
