"""Fusing an exported graph: ONNX Runtime's transformer optimizer, then our own attention pattern.

ONNX Runtime's optimizer (``onnxruntime.transformers.optimizer``) fuses LayerNorm + residual
(SkipLayerNormalization), bias + GELU (BiasGelu) and BERT's embeddings (EmbedLayerNormalization),
but its attention patterns do not match this exporter's: scores masked with
``Where(not mask, finfo.min, scores)`` (``model_export/models/layers.py``), and the decoders' KV cache
``Concat``. So ``fuse_attention`` rewrites our own pattern

    Softmax(Where(not_mask, min, MatMul(q, Transpose(k, [0, 1, 3, 2])) / sqrt(Dh))) @ v

into one ONNX ``Attention`` (opset 23) on the 4-D q, k, v, with the mask turned into an additive
float mask (0 where allowed, the dtype's minimum where not: exactly what the masked scores were, so
a fully masked padding row stays finite, as in torch) broadcast to (.., T, S), which ONNX Runtime's
CPU kernel needs. The graph's default-domain opset becomes 23.

Why ONNX ``Attention`` and not ``com.microsoft.MultiHeadAttention``: it takes q, k, v as the
(batch, heads, sequence, head_dim) tensors our graphs already have, so the decoders' concatenated KV
cache and the translator's precomputed cross keys feed it as they are (MultiHeadAttention wants the
query as (batch, sequence, hidden)); and it is no slower. One attention block at all-MiniLM-L6-v2's
shapes (12 heads of 32), ONNX Runtime 1.31 CPU, 2 threads of an AVX-512 Xeon, median of 7
interleaved rounds: batch 1 x 64 tokens 0.213 ms (MultiHeadAttention 0.210), batch 32 x 64 4.48 ms
(5.03 with an additive bias, 5.09 with a key padding mask), 32 x 128 15.7 ms (17.5, 16.8), with
the transposes to and from heads counted on our side; both within 1e-6 of a float64 reference.

Before the optimizer, ``ReduceL2`` (the embedder's L2 normalisation) becomes ``Sqrt(ReduceSum(x*x))``:
ONNX Runtime's symbolic shape inference cannot read the former, and without shapes the optimizer
fuses no LayerNorm at all.
"""

from __future__ import annotations

import collections
import contextlib
import io
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


def quiet_optimizer_logs() -> None:
    """ONNX Runtime's transformer tools log a line per fusion ("Fused Gelu: 6"), pages per build.

    They log under their bare module names (``fusion_base``, ``onnx_model``: the package puts its own
    folder on ``sys.path``): those, and the package's own logger, keep only errors. What was fused is
    in our own one line per graph and in the manifest's op counts.
    """
    import onnxruntime.transformers as transformers

    modules = {f.stem for f in Path(transformers.__file__).parent.glob("*.py")}
    for name in ["onnxruntime.transformers", *modules]:
        logging.getLogger(name).setLevel(logging.ERROR)


def optimize(path: Path, task: str, num_heads: int, hidden_size: int) -> onnx.ModelProto:
    """ONNX Runtime's transformer fusions, hardware-independent (opt_level 0: no session rewrites baked in)."""
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = OPTIMIZER_TYPES.get(task, "bert")
    quiet_optimizer_logs()
    source = onnx.load(str(path))
    readable = _reductions_shape_inference_reads(source)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the optimizer prints, rather than logs, what it skipped
        try:
            optimized = optimize_model(
                source if readable else str(path),
                model_type=model_type,
                num_heads=num_heads,
                hidden_size=hidden_size,
                opt_level=0,
            )
        except IndexError:  # its GPT-2 pass expects ONNX Runtime's own export of GPT-2, not transformers'
            if model_type == "bert":
                raise
            log.info("%s: the %s optimizer failed; its generic (bert) fusions instead", path.name, model_type)
            optimized = optimize_model(
                onnx.load(str(path)),
                model_type="bert",
                num_heads=num_heads,
                hidden_size=hidden_size,
                opt_level=0,
            )
    if "failed in shape inference" in printed.getvalue():
        # Symbolic shape inference has no rule for some op of this graph; only the fusions that need
        # it (SkipLayerNormalization) are skipped. Parity and the op counts in the manifest show
        # what was fused.
        log.info("%s: the optimizer's shape inference gave up; fusions that need it were skipped", path.name)
    model = optimized.model
    if not any(o.domain == "com.microsoft" for o in model.opset_import):  # its fused ops live there
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _reductions_shape_inference_reads(model: onnx.ModelProto) -> int:
    """Rewrite ``ReduceL2(x)`` as ``Sqrt(ReduceSum(x * x))`` (what it computes); returns how many.

    The optimizer's SkipLayerNormalization fusion needs symbolic shape inference of the whole graph,
    and ONNX Runtime's ``SymbolicShapeInference`` has no rule for ``ReduceL2`` with its axes as an
    input (opset 18): the embedder's L2 normalisation left its output rank unknown, inference
    failed, and none of its LayerNorms fused. ``ReduceSum`` it does read.
    """
    rewritten, nodes = 0, []
    for node in model.graph.node:
        if node.op_type != "ReduceL2" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        prefix = f"{node.name or node.output[0]}_l2"
        nodes.append(helper.make_node("Mul", [node.input[0], node.input[0]], [f"{prefix}_square"]))
        nodes.append(
            helper.make_node(
                "ReduceSum",
                [f"{prefix}_square", *node.input[1:]],
                [f"{prefix}_sum"],
                name=f"{prefix}_sum",
            )
        )
        nodes[-1].attribute.extend(node.attribute)  # keepdims, noop_with_empty_axes mean the same
        nodes.append(helper.make_node("Sqrt", [f"{prefix}_sum"], list(node.output), name=f"{prefix}_sqrt"))
        rewritten += 1
    if rewritten:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return rewritten


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
    fused, removed, added = 0, set[int](), []
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
    if not fused:  # a graph whose attention is not ours (an imported checkpoint's): its opset still rises,
        _raise_opset(model)  # so every fused graph can be quantized per row (QuantizeLinear's block_size: 21)
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
    _raise_opset(model)
    return fused


def _raise_opset(model: onnx.ModelProto) -> None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, ATTENTION_OPSET)
    model.ir_version = max(model.ir_version, 10)


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
