"""A decoding-step graph whose KV cache is updated in place: GroupQueryAttention over a shared buffer.

The exported decoders append each step's keys/values to the past with ``Concat``: every step copies
the whole past into a new ``present`` tensor, so a step's cost grows with the past even where the
attention itself is cheap. ONNX Runtime GenAI decodes instead with a buffer preallocated per running
batch, (batch, heads, max_length, head_dim), that ``com.microsoft.GroupQueryAttention`` writes the new
keys/values into when ``past`` and ``present`` are bound to the same memory
(``past_present_share_buffer``), reading only each row's valid prefix (``seqlens_k``).

``rewrite_inplace`` turns a fused decoder graph (``fusion.fuse_attention``'s ONNX ``Attention`` over
``Concat(past, new)``) into that step graph, layer by layer:

    Attention(q, Concat(past_k, k), Concat(past_v, v), mask)      -> context (B, H, T, Dh)
    becomes
    GroupQueryAttention(q', k', v', past_k, past_v, seqlens_k, total_sequence_length)
                                                                  -> context' (B, T, D), present_k, present_v

with q', k', v' the (B, T, H * Dh) tensors before the split into heads. The mask input goes: a row's
valid keys are its first ``seqlens_k + 1`` buffer columns (past, then the new token), the layout the
service's ``KVBuffer`` keeps (left-aligned, so no padding inside a row's prefix). Inputs become
``input_ids`` (B, new), ``position_ids`` (B, new), ``seqlens_k`` (B,) int32 (each row's past length +
new - 1), ``total_sequence_length`` () int32 (the longest past + new) and the buffers (``new`` is 1 for a
batch; GroupQueryAttention takes several new tokens over a past for one row only); ``present_*`` have the
buffers' shape. GroupQueryAttention runs on ONNX Runtime's CPU provider in float32; its CUDA kernel
takes float16 / bfloat16 only, so this graph is a CPU variant.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from service.engine.manifest import KVCacheSpec

from .fusion import _constant, _drop_dead_nodes

log = logging.getLogger(__name__)

SEQLENS = "seqlens_k"
TOTAL = "total_sequence_length"
MAX_AXIS = "max_sequence"  # the buffers' length axis
NEW_AXIS = "new"  # new tokens per row: 1 when decoding a batch; more for one row (GroupQueryAttention's rule)


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def _before_heads(producer: dict[str, onnx.NodeProto], name: str) -> str | None:
    """The (B, T, H, Dh) tensor that ``Transpose(perm=[0, 2, 1, 3])`` made ``name`` from, if so."""
    node = producer.get(name)
    if node is None or node.op_type != "Transpose":
        return None
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return node.input[0] if perm == [0, 2, 1, 3] else None


def _projection(producer: dict[str, onnx.NodeProto], name: str) -> str | None:
    """The (B, T, H * Dh) projection that ``Reshape`` then ``Transpose`` split into the heads ``name``."""
    view = _before_heads(producer, name)
    reshape = producer.get(view) if view is not None else None
    return reshape.input[0] if reshape is not None and reshape.op_type == "Reshape" else None


def _merged_heads(consumers: dict[str, list[onnx.NodeProto]], name: str) -> list[onnx.NodeProto] | None:
    """``Transpose(perm=[0, 2, 1, 3])`` then ``Reshape`` back to (B, T, H * Dh) of ``name``, if that is all
    that reads it: GroupQueryAttention's output is already that tensor."""
    after = consumers.get(name, [])
    if len(after) != 1 or after[0].op_type != "Transpose":
        return None
    perm = next((list(a.ints) for a in after[0].attribute if a.name == "perm"), None)
    merge = consumers.get(after[0].output[0], [])
    if perm != [0, 2, 1, 3] or len(merge) != 1 or merge[0].op_type != "Reshape":
        return None
    return [after[0], merge[0]]


def _packed_projection(
    graph: onnx.GraphProto, producer: dict[str, onnx.NodeProto], projections: list[str], prefix: str
) -> tuple[list[onnx.NodeProto], str] | None:
    """q, k and v as one MatMul and one Add of (B, T, 3 D), where each is ``Add(MatMul(x, W), b)`` of the
    same x with constant W and b: GroupQueryAttention takes them packed, one kernel instead of six."""
    parts: list[tuple[str, np.ndarray, np.ndarray]] = []
    for name in projections:
        add = producer.get(name)
        if add is None or add.op_type != "Add":
            return None
        found = None
        for product, bias_name in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
            matmul, bias = producer.get(product), _constant(graph, bias_name)
            if matmul is not None and matmul.op_type == "MatMul" and bias is not None and bias.ndim == 1:
                weight = _constant(graph, matmul.input[1])
                if weight is not None and weight.ndim == 2:
                    found = (matmul.input[0], weight, bias)
        if found is None:
            return None
        parts.append(found)
    if len({x for x, _, _ in parts}) != 1:
        return None
    weight = numpy_helper.from_array(np.concatenate([w for _, w, _ in parts], axis=1), f"{prefix}_qkv_weight")
    bias = numpy_helper.from_array(np.concatenate([b for _, _, b in parts]), f"{prefix}_qkv_bias")
    graph.initializer.extend([weight, bias])
    nodes = [
        helper.make_node("MatMul", [parts[0][0], weight.name], [f"{prefix}_qkv_product"]),
        helper.make_node("Add", [f"{prefix}_qkv_product", bias.name], [f"{prefix}_qkv"]),
    ]
    return nodes, f"{prefix}_qkv"


def rewrite_inplace(model: onnx.ModelProto, num_heads: int, head_dim: int, past_names: list[str]) -> int:
    """Rewrite every ``Attention`` over a concatenated past into GroupQueryAttention; returns how many.

    GroupQueryAttention reads q, k, v as (B, T, H * Dh) and returns its context that way, so where the
    graph splits projections into heads (Reshape, Transpose) and merges the context back (Transpose,
    Reshape), those go too, and where q, k and v are plain projections of one input (fp32) they become
    one packed MatMul + Add: fewer nodes per step, which is what a one-token step mostly costs.
    Raises ValueError when a layer's past does not feed such an attention (nothing is half rewritten:
    the caller keeps the Concat graph).
    """
    graph = model.graph
    producer = _producers(graph)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    past = set(past_names)
    hidden = num_heads * head_dim
    flat = numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "inplace_flat_shape")
    heads = numpy_helper.from_array(np.array([0, 0, num_heads, head_dim], np.int64), "inplace_heads_shape")
    graph.initializer.extend([flat, heads])
    replaced: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    rewrites = 0
    for node in list(graph.node):
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
            continue
        concats = [producer.get(name) for name in node.input[1:3]]
        if any(c is None or c.op_type != "Concat" or c.input[0] not in past for c in concats):
            continue
        key_cat, value_cat = concats
        assert key_cat is not None and value_cat is not None
        prefix = f"inplace_{rewrites}"
        nodes: list[onnx.NodeProto] = []
        flat_inputs = []
        for role, name in (("q", node.input[0]), ("k", key_cat.input[1]), ("v", value_cat.input[1])):
            projected = _projection(producer, name)
            if projected is None:  # not a plain split: flatten the heads again
                split = _before_heads(producer, name)
                if split is None:
                    raise ValueError(f"attention {node.name}: its {role} is not a split into heads")
                nodes.append(helper.make_node("Reshape", [split, flat.name], [f"{prefix}_{role}"]))
                projected = f"{prefix}_{role}"
            flat_inputs.append(projected)
        packed = _packed_projection(graph, producer, flat_inputs, prefix) if not nodes else None
        if packed is not None:  # one (B, T, 3 D) input; key and value are left out
            nodes += packed[0]
            flat_inputs = [packed[1], "", ""]
        scale = next((a.f for a in node.attribute if a.name == "scale"), 1.0 / np.sqrt(head_dim))
        merged = _merged_heads(consumers, node.output[0])
        if merged is not None and not _to_three_axes(graph, merged[1]):
            # The merge reshapes to another shape than (B, T, H * Dh) (transformers' GPT-2 goes straight to
            # (B * T, D) for its Conv1D): keep that Reshape, reading GroupQueryAttention's (B, T, D) context,
            # which holds the same values in the same order as the (B, T, H, Dh) it read before.
            merged[1].input[0] = f"{prefix}_context"
            merged = merged[:1]
        context = merged[-1].output[0] if merged is not None and len(merged) == 2 else f"{prefix}_context"
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [*flat_inputs, key_cat.input[0], value_cat.input[0], SEQLENS, TOTAL],
                [context, key_cat.output[0], value_cat.output[0]],
                domain="com.microsoft",
                name=f"{prefix}_gqa",
                num_heads=num_heads,
                kv_num_heads=num_heads,
                scale=float(scale),
            )
        )
        if merged is None:  # give the graph its (B, H, T, Dh) context back
            nodes += [
                helper.make_node("Reshape", [context, heads.name], [f"{prefix}_context_heads"]),
                helper.make_node(
                    "Transpose", [f"{prefix}_context_heads"], [node.output[0]], perm=[0, 2, 1, 3]
                ),
            ]
        else:
            removed.update(id(n) for n in merged)
        replaced[id(node)] = nodes
        removed.update({id(node), id(key_cat), id(value_cat)})
        rewrites += 1
    if rewrites * 2 != len(past_names):
        raise ValueError(
            f"{rewrites} attention(s) over a concatenated past, for {len(past_names)} past tensors"
        )
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        kept.extend(replaced.get(id(node), []))
        if id(node) not in removed:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    _drop_dead_nodes(graph)
    _retype_inputs(graph, past)
    del graph.value_info[:]
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return rewrites


def _to_three_axes(graph: onnx.GraphProto, reshape: onnx.NodeProto) -> bool:
    """Whether ``reshape``'s target shape has three axes, (B, T, H * Dh): a constant of three, or a Concat
    of pieces (this exporter's dynamic B and T) adding up to three."""
    shape = _constant(graph, reshape.input[1])
    if shape is not None:
        return bool(shape.size == 3)
    concat = _producers(graph).get(reshape.input[1])
    if concat is None or concat.op_type != "Concat":
        return False
    sizes = [_constant(graph, piece) for piece in concat.input]
    return sum(1 if size is None else size.size for size in sizes) == 3


def _retype_inputs(graph: onnx.GraphProto, past: set[str]) -> None:
    """New tokens on a ``new`` axis (one per row when decoding; several for one row at a time, which is
    what GroupQueryAttention takes over a past: speculative decoding's check), the valid lengths as
    inputs, buffers of ``max_sequence`` columns."""
    used = {name for node in graph.node for name in node.input}
    inputs = [i for i in graph.input if i.name in used]
    for value in [*inputs, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.name in past or value.name.startswith("present_"):
            dims[2].ClearField("dim_value")
            dims[2].dim_param = MAX_AXIS
        elif value.name in ("input_ids", "position_ids") or value.name == graph.output[0].name:
            dims[1].ClearField("dim_value")
            dims[1].dim_param = NEW_AXIS
    inputs += [
        helper.make_tensor_value_info(SEQLENS, TensorProto.INT32, ["batch"]),
        helper.make_tensor_value_info(TOTAL, TensorProto.INT32, []),
    ]
    del graph.input[:]
    graph.input.extend(inputs)


def _other_inputs(
    session: object, rows: int, rng: np.random.Generator, length: int = 7
) -> dict[str, np.ndarray]:
    """Feeds for a decoder's inputs besides the token, positions, mask and past (the translator's cross
    keys/values and source mask): a ``length``-token source, all of it real."""
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():  # type: ignore[attr-defined]
        if spec.name in ("input_ids", "attention_mask", "position_ids") or spec.name.startswith("past_"):
            continue
        shape = [rows if i == 0 else (d if isinstance(d, int) else length) for i, d in enumerate(spec.shape)]
        if spec.type == "tensor(int64)":
            feeds[spec.name] = np.ones(shape, np.int64)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def step_difference(
    concat_file: str, inplace_file: str, kv: dict, lengths: tuple[int, ...] = (5, 0, 12)
) -> float:
    """Largest |in-place step - Concat step| over the logits and the new keys/values, on one decoding step.

    Rows with pasts of different lengths, one of them empty: the Concat graph gets them right-aligned
    (left padding masked), the in-place graph left-aligned in a buffer bound as both past and present.
    """
    import onnxruntime as ort

    spec = KVCacheSpec.model_validate(kv)  # the manifest's kv_cache section, typed
    heads, head_dim = spec.num_heads, spec.head_dim
    past_names, present_names = spec.past_names, spec.present_names
    rng = np.random.default_rng(0)
    rows, width, capacity = len(lengths), max(lengths), max(lengths) + 4
    lens = np.array(lengths, np.int64)
    past = [rng.standard_normal((rows, heads, width, head_dim)).astype(np.float32) for _ in past_names]
    mask = (np.arange(width + 1)[None, :] >= (width - lens)[:, None]).astype(np.int64)  # (B, W + 1)
    ids = rng.integers(5, 100, (rows, 1)).astype(np.int64)
    positions = lens.reshape(rows, 1)
    concat = ort.InferenceSession(concat_file, providers=["CPUExecutionProvider"])
    other = _other_inputs(concat, rows, rng)
    feeds = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        **other,
        **dict(zip(past_names, past, strict=True)),
    }
    logits, *present = concat.run(None, feeds)
    session = ort.InferenceSession(inplace_file, providers=["CPUExecutionProvider"])
    kv_type = next(i.type for i in session.get_inputs() if i.name == past_names[0])
    dtype = np.float16 if kv_type == "tensor(float16)" else np.float32  # to_fp16_step's buffers: float16
    buffers = [np.zeros((rows, heads, capacity, head_dim), dtype) for _ in past_names]
    for buffer, tensor in zip(buffers, past, strict=True):
        for row, length in enumerate(lengths):
            buffer[row, :, :length] = tensor[row, :, width - length :]
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", ids)
    binding.bind_cpu_input("position_ids", positions)
    binding.bind_cpu_input(SEQLENS, lens.astype(np.int32))
    binding.bind_cpu_input(TOTAL, np.array(width + 1, np.int32))
    for name, value in other.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output(session.get_outputs()[0].name, "cpu")
    for name, out, buffer in zip(past_names, present_names, buffers, strict=True):
        binding.bind_input(name, "cpu", 0, dtype, list(buffer.shape), buffer.ctypes.data)
        binding.bind_output(out, "cpu", 0, dtype, list(buffer.shape), buffer.ctypes.data)
    session.run_with_iobinding(binding)
    worst = float(np.abs(binding.get_outputs()[0].numpy() - logits).max())
    for buffer, tensor in zip(buffers, present, strict=True):
        for row, length in enumerate(lengths):  # the row's past and its new column, in both layouts
            got, want = buffer[row, :, : length + 1].astype(np.float32), tensor[row, :, width - length :]
            worst = max(worst, float(np.abs(got - want).max()))
    return worst


def to_fp16_step(model: onnx.ModelProto, past_names: list[str], present_names: list[str]) -> onnx.ModelProto:
    """An fp32 in-place step graph (``rewrite_inplace``) in float16, its KV buffers float16 too.

    GroupQueryAttention's CUDA kernel takes float16 (or bfloat16) only, so on CUDA the buffers that
    ``past_*`` and ``present_*`` share must be float16: every other input and the logits stay float32
    (ONNX Runtime's ``convert_float_to_float16`` casts them at the edges), as in the fp16 variant.
    """
    from onnxruntime.transformers.onnx_model import OnnxModel

    kv = set(past_names) | set(present_names)
    edges = [v.name for v in (*model.graph.input, *model.graph.output) if v.name not in kv]
    wrapped = OnnxModel(model)
    wrapped.convert_float_to_float16(keep_io_types=edges)
    return wrapped.model
