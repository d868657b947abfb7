"""GPT's in-place KV step graph in fp16 on CUDA: greedy tokens against the fp16 Concat decoder.

    python scripts/gpu/inplace_fp16.py --model DIR [--device cuda|cpu] [--new-tokens 32] [--json FILE]

The model folder must have an fp16 variant and fused fp32 graphs (the reference of a folder carried by
``pack.py``, or its ``fused`` variant). From the fused decoder this writes the in-place step graph
(``inplace_kv.rewrite_inplace``) in float16 (``inplace_kv.to_fp16_step``: GroupQueryAttention's CUDA
kernel takes float16), then decodes prompts of different lengths two ways, on the same device:

- Concat: the fp16 variant through the service's ``DecoderGraph`` (on CUDA, IO binding: the cache
  stays on the device, and every step concatenates the past);
- in place: the same prefill, its cache moved once into float16 buffers of ``max_sequence_length``
  columns on the device, left-aligned; each step binds ``past_*`` and ``present_*`` to the same
  buffer memory, so GroupQueryAttention writes the new column where it is and copies nothing.

Prints and writes whether the greedy tokens agree, the largest logits difference, and both ways'
tokens/s. The service's engine does not use this graph on CUDA yet: the buffers would have to live
on the device across joins and leaves; this is the check that comes first.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import onnx

from model_export.inplace_kv import SEQLENS, TOTAL, rewrite_inplace, to_fp16_step
from service.engine.decoder_graph import DecoderGraph
from service.engine.kv_cache import CacheLayout, KVBuffer, KVCache
from service.engine.manifest import required
from service.engine.repository import load_model, read_manifest
from service.engine.runtime import CUDA, RuntimeOptions, create_session, ort

PROMPTS = ["ROMEO:", "KING HENRY:\nWhat says", "First Citizen:\nBefore we proceed any further, hear me"]


def fused_file(folder: Path) -> str:
    manifest = read_manifest(folder)
    if "fused" in manifest.variants:
        return manifest.variants["fused"].graphs["model"]
    return manifest.graphs["model"].file  # a carried copy: the fused graphs stand as the reference


def write_step_graph(folder: Path, out: Path) -> Path:
    manifest = read_manifest(folder)
    kv = required(manifest.kv_cache)
    model = onnx.load(str(folder / fused_file(folder)))
    rewrite_inplace(model, kv.num_heads, kv.head_dim, kv.past_names)
    half = to_fp16_step(model, kv.past_names, kv.present_names)
    path = out / "model.fp16.inplace.onnx"
    onnx.save(half, str(path))
    return path


def concat_tokens(
    folder: Path, device: str, prompts: list[list[int]], new: int
) -> tuple[list[list[int]], list[np.ndarray], float]:
    model = load_model(folder, RuntimeOptions(device=device, variant="fp16"), check_hashes=False)  # type: ignore[arg-type]
    decoder = DecoderGraph(model.graphs["model"], model.manifest)  # no in-place graph: Concat every step
    started = time.perf_counter()
    logits, first = decoder.prefill(prompts)
    cache: KVCache | KVBuffer = first
    tokens, seen = [], []
    for _ in range(new):
        chosen = logits.argmax(-1)
        tokens.append(chosen)
        seen.append(logits)
        logits, cache = decoder.decode(chosen, cache)
    seconds = time.perf_counter() - started
    return np.stack(tokens, 1).tolist(), seen, seconds


def inplace_tokens(
    folder: Path, step_file: Path, device: str, prompts: list[list[int]], new: int
) -> tuple[list[list[int]], list[np.ndarray], float]:
    model = load_model(folder, RuntimeOptions(device=device, variant="fp16"), check_hashes=False)  # type: ignore[arg-type]
    layout = CacheLayout.of(required(model.manifest.kv_cache))
    capacity = required(model.manifest.max_sequence_length)
    session = create_session(step_file, RuntimeOptions(device=device))  # type: ignore[arg-type]
    on_cuda = session.get_providers()[0] == CUDA
    where = "cuda" if on_cuda else "cpu"
    decoder = DecoderGraph(model.graphs["model"], model.manifest)
    started = time.perf_counter()
    logits, cache = decoder.prefill(prompts)  # the fp16 variant's prefill, as the service runs it
    rows, lengths = len(prompts), cache.lengths.astype(np.int64)
    buffers = []
    for tensor in cache.tensors:  # (B, H, W, Dh) fp32, right-aligned -> (B, H, capacity, Dh) fp16, left
        host = tensor.numpy() if isinstance(tensor, ort.OrtValue) else tensor
        buffer = np.zeros((rows, host.shape[1], capacity, host.shape[3]), np.float16)
        for row, length in enumerate(lengths):
            buffer[row, :, :length] = host[row, :, cache.width - length :]
        buffers.append(ort.OrtValue.ortvalue_from_numpy(buffer, where, 0))
    binding = session.io_binding()
    binding.bind_output(session.get_outputs()[0].name, "cpu")  # first: get_outputs() keeps the order bound
    for past, present, value in zip(layout.past_names, layout.present_names, buffers, strict=True):
        shape, pointer = value.shape(), value.data_ptr()
        binding.bind_input(past, where, 0, np.float16, shape, pointer)
        binding.bind_output(present, where, 0, np.float16, shape, pointer)
    tokens, seen = [], []
    for _ in range(new):
        chosen = logits.argmax(-1)
        tokens.append(chosen)
        seen.append(logits)
        binding.bind_cpu_input("input_ids", chosen.reshape(rows, 1).astype(np.int64))
        binding.bind_cpu_input("position_ids", lengths.reshape(rows, 1))
        binding.bind_cpu_input(SEQLENS, lengths.astype(np.int32))
        binding.bind_cpu_input(TOTAL, np.array(lengths.max() + 1, np.int32))
        session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()[:, -1, :]
        lengths = lengths + 1
    seconds = time.perf_counter() - started
    return np.stack(tokens, 1).tolist(), seen, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a GPT folder with fp16 and fused graphs")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = load_model(args.model, RuntimeOptions(device="cpu"), check_hashes=False)
    assert model.tokenizer is not None
    prompts = [model.tokenizer.encode(p).ids for p in PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        step = write_step_graph(args.model, Path(tmp))
        ops = sorted({n.op_type for n in onnx.load(str(step)).graph.node})
        concat, concat_logits, concat_s = concat_tokens(args.model, args.device, prompts, args.new_tokens)
        inplace, inplace_logits, inplace_s = inplace_tokens(
            args.model, step, args.device, prompts, args.new_tokens
        )
    first = next((i for i, (a, b) in enumerate(zip(concat, inplace, strict=True)) if a != b), None)
    # Up to the first step where any row's token differs (after it the two decode different texts).
    agree = next(
        (
            s
            for s in range(args.new_tokens)
            if any(a[s] != b[s] for a, b in zip(concat, inplace, strict=True))
        ),
        args.new_tokens - 1,
    )
    worst = max(
        float(np.abs(a - b).max()) for a, b in zip(concat_logits[: agree + 1], inplace_logits, strict=False)
    )
    found = {
        "model": str(args.model),
        "device": args.device,
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": args.new_tokens,
        "same_tokens": concat == inplace,
        "first_row_differing": first,
        "logits_max_abs_diff_while_same": worst,  # up to and including the first differing step
        "concat_tokens_per_s": len(prompts) * args.new_tokens / concat_s,
        "inplace_tokens_per_s": len(prompts) * args.new_tokens / inplace_s,
        "step_graph_ops": ops,
        "concat": concat,
        "inplace": inplace,
    }
    print(json.dumps({k: v for k, v in found.items() if k not in ("concat", "inplace")}, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    return 0 if found["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
