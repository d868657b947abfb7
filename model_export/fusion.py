"""Fusing an exported graph: ONNX Runtime's transformer optimizer, then our own attention pattern.

ONNX Runtime's optimizer (``onnxruntime.transformers.optimizer``) fuses LayerNorm + residual
(SkipLayerNormalization), bias + GELU (BiasGelu) and BERT's embeddings (EmbedLayerNormalization),
but its attention patterns do not match this exporter's: scores masked with
``Where(not mask, finfo.min, scores)`` (``model_export/layers.py``), and the decoders' KV cache
``Concat``. So ``fuse_attention`` rewrites our own pattern

    Softmax(Where(not_mask, min, MatMul(q, Transpose(k, [0, 1, 3, 2])) / sqrt(Dh))) @ v

into one ONNX ``Attention`` (opset 23) on the 4-D q, k, v, with the mask turned into an additive
float mask (0 where allowed, the dtype's minimum where not: exactly what the masked scores were, so
a fully masked padding row stays finite, as in torch) broadcast to (.., T, S), which ONNX Runtime's
CPU kernel needs. The graph's default-domain opset becomes 23.
"""

from __future__ import annotations

import collections
import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

log = logging.getLogger(__name__)

ATTENTION_OPSET = 23
# manifest architecture / task -> the optimizer's model type
OPTIMIZER_TYPES = {"text-generation": "gpt2", "image-classification": "vit"}


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def optimize(path: Path, task: str, num_heads: int, hidden_size: int) -> onnx.ModelProto:
    """ONNX Runtime's transformer fusions, hardware-independent (opt_level 0: no session rewrites baked in)."""
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = OPTIMIZER_TYPES.get(task, "bert")
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimize_model(
        str(path), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size, opt_level=0
    )
    model = optimized.model
    if not any(o.domain == "com.microsoft" for o in model.opset_import):  # its fused ops live there
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _constant(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    return None


def fuse_attention(model: onnx.ModelProto) -> int:
    """Rewrite every masked scaled-dot-product attention of ours into ONNX ``Attention``; returns how many."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    fused, removed, added = 0, set(), []
    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        where = producer.get(softmax.input[0])
        if where is not None and where.op_type == "Where":  # masked scores
            scaled, fill = producer.get(where.input[2]), _constant(graph, where.input[1])
            if fill is None or fill.size != 1:
                continue
        else:  # no mask (ViT)
            scaled, where, fill = where, None, None
        if scaled is None or scaled.op_type not in ("Div", "Mul"):
            continue
        factor = _constant(graph, scaled.input[1])
        scores = producer.get(scaled.input[0])
        if factor is None or factor.size != 1 or scores is None or scores.op_type != "MatMul":
            continue
        k_t = producer.get(scores.input[1])
        if k_t is None or k_t.op_type != "Transpose":
            continue
        perm = next((list(a.ints) for a in k_t.attribute if a.name == "perm"), None)
        if perm not in ([0, 1, 3, 2], [0, 2, 3, 1]):  # from (B, H, S, Dh), or straight from (B, S, H, Dh)
            continue
        after = consumers.get(softmax.output[0], [])
        if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[0] != softmax.output[0]:
            continue
        context = after[0]
        q, k, v = scores.input[0], k_t.input[0], context.input[1]
        scale = float(1.0 / factor.item()) if scaled.op_type == "Div" else float(factor.item())
        prefix = f"fused_attention_{fused}"
        to_heads = []
        if perm == [0, 2, 3, 1]:  # the keys are still (B, S, H, Dh): bring them to (B, H, S, Dh)
            to_heads = [helper.make_node("Transpose", [k], [f"{prefix}_k"], perm=[0, 2, 1, 3])]
            k = f"{prefix}_k"
        if where is None or fill is None:
            nodes = [
                *to_heads,
                helper.make_node("Attention", [q, k, v], [context.output[0]], scale=scale, name=prefix),
            ]
            added.append((context, nodes))
            removed.update(id(n) for n in (scores, scaled, softmax, context))
            if len(consumers.get(k_t.output[0], [])) == 1:
                removed.add(id(k_t))
            fused += 1
            continue
        dtype = fill.dtype
        zero = numpy_helper.from_array(np.zeros((), dtype), f"{prefix}_zero")
        minimum = numpy_helper.from_array(np.array(fill.item(), dtype), f"{prefix}_min")
        graph.initializer.extend([zero, minimum])
        nodes = [
            *to_heads,
            # additive mask: the masked scores were exactly `fill`; allowed ones keep their value
            helper.make_node("Where", [where.input[0], minimum.name, zero.name], [f"{prefix}_bias"]),
            helper.make_node("Shape", [q], [f"{prefix}_q_shape"], start=2, end=3),
            helper.make_node("Shape", [k], [f"{prefix}_k_shape"], start=2, end=3),
            helper.make_node(
                "Constant",
                [],
                [f"{prefix}_ones"],
                value=numpy_helper.from_array(np.ones(2, np.int64)),
            ),
            helper.make_node(
                "Concat",
                [f"{prefix}_ones", f"{prefix}_q_shape", f"{prefix}_k_shape"],
                [f"{prefix}_mask_shape"],
                axis=0,
            ),
            helper.make_node("Expand", [f"{prefix}_bias", f"{prefix}_mask_shape"], [f"{prefix}_mask"]),
            helper.make_node(
                "Attention", [q, k, v, f"{prefix}_mask"], [context.output[0]], scale=scale, name=prefix
            ),
        ]
        added.append((context, nodes))
        for node in (scores, scaled, where, softmax, context):
            removed.add(id(node))
        if len(consumers.get(k_t.output[0], [])) == 1:
            removed.add(id(k_t))
        fused += 1
    if not fused:
        return 0
    kept: list[onnx.NodeProto] = []
    by_anchor = {id(anchor): nodes for anchor, nodes in added}
    for node in graph.node:
        if id(node) in by_anchor:
            kept.extend(
                by_anchor[id(node)]
            )  # the new nodes where the context MatMul was: order stays topological
        if id(node) not in removed:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    _drop_dead_nodes(graph)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, ATTENTION_OPSET)
    model.ir_version = max(model.ir_version, 10)
    return fused


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes none of whose outputs is used, then initializers nothing reads (what the rewrite left)."""
    outputs = {o.name for o in graph.output}
    while True:
        used = {name for node in graph.node for name in node.input} | outputs
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            unread = [i for i in graph.initializer if i.name not in used]
            for init in unread:
                graph.initializer.remove(init)
            return
        ids = {id(n) for n in dead}
        kept = [n for n in graph.node if id(n) not in ids]
        del graph.node[:]
        graph.node.extend(kept)
