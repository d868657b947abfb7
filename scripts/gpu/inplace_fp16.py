"""GPT's in-place KV step graph in fp16, against the Concat decoder and against recomputation.

    python scripts/gpu/inplace_fp16.py --model DIR [--device cuda|cpu] [--new-tokens 32] [--json FILE]

The model folder must have an fp16 variant and fused fp32 graphs (the reference of a folder carried by
``pack.py``, or its ``fused`` variant). From the fused decoder this writes the in-place step graph
(``inplace_kv.rewrite_inplace``) in float16 (``inplace_kv.to_fp16_step``: GroupQueryAttention's CUDA
kernel takes float16). Then five ways decode the same tokens (teacher-forced: the fp32 Concat
decoder's greedy choices) from prompts of different lengths, on one device, so that every step's
logits can be compared even where a way would have chosen differently:

- ``fp32_concat`` / ``fp16_concat``: the fused and fp16 graphs through the service's ``DecoderGraph``
  (on CUDA, IO binding: the cache stays on the device; every step concatenates the past);
- ``fp16_inplace``: the same fp16 prefill, its cache moved once into float16 buffers of
  ``max_sequence_length`` columns on the device, left-aligned; each step binds ``past_*`` and
  ``present_*`` to the same memory, so GroupQueryAttention writes the new column where it is;
- ``fp32_recompute`` / ``fp16_recompute``: no cache: one causal pass over each whole sequence.

Prints and writes, per way, the largest logits difference from ``fp32_recompute`` (and per row), how
often its argmax is the forced token, and its decoding tokens/s; ``same_tokens`` says whether the
in-place way would choose as the fp16 Concat way does. The service's engine does not use this graph
on CUDA yet: its buffers would have to live on the device across joins and leaves.
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
from service.engine.kv_cache import KVBuffer, KVCache
from service.engine.manifest import required
from service.engine.repository import load_model, read_manifest
from service.engine.runtime import CUDA, Graph, RuntimeOptions, create_session, ort

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


Logits = list[np.ndarray]  # per step, (rows, V)


def stepwise(decoder: DecoderGraph, prompts: list[list[int]], forced: np.ndarray) -> tuple[Logits, float]:
    """Logits before each forced token, decoding step by step with ``decoder``'s KV cache."""
    started = time.perf_counter()
    logits, first = decoder.prefill(prompts)
    cache: KVCache | KVBuffer = first
    seen = [logits]
    for step in range(forced.shape[1] - 1):
        logits, cache = decoder.decode(forced[:, step], cache)
        seen.append(logits)
    return seen, time.perf_counter() - started


def recomputed(decoder: DecoderGraph, prompts: list[list[int]], forced: np.ndarray) -> Logits:
    """The same logits from one causal pass over each prompt and its forced tokens (no cache)."""
    full = [[*p, *forced[i, :-1].tolist()] for i, p in enumerate(prompts)]
    every, _ = decoder.prefill_all(full)  # (n, L, V), left-padded
    width = every.shape[1]
    return [
        np.stack([every[i, width - len(full[i]) + len(p) - 1 + step] for i, p in enumerate(prompts)])
        for step in range(forced.shape[1])
    ]


def inplace(
    decoder: DecoderGraph,
    step_file: Path,
    device: str,
    capacity: int,
    prompts: list[list[int]],
    forced: np.ndarray,
) -> tuple[Logits, float]:
    """Logits before each forced token, the cache in float16 buffers updated in place by the step graph."""
    session = create_session(step_file, RuntimeOptions(device=device))  # type: ignore[arg-type]
    where = "cuda" if session.get_providers()[0] == CUDA else "cpu"
    started = time.perf_counter()
    logits, cache = decoder.prefill(prompts)  # the fp16 prefill, as the service would run it
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
    for past, present, value in zip(
        decoder.layout.past_names, decoder.layout.present_names, buffers, strict=True
    ):
        shape, pointer = value.shape(), value.data_ptr()
        binding.bind_input(past, where, 0, np.float16, shape, pointer)
        binding.bind_output(present, where, 0, np.float16, shape, pointer)
    seen = [logits]
    for step in range(forced.shape[1] - 1):
        binding.bind_cpu_input("input_ids", forced[:, step].reshape(rows, 1).astype(np.int64))
        binding.bind_cpu_input("position_ids", lengths.reshape(rows, 1))
        binding.bind_cpu_input(SEQLENS, lengths.astype(np.int32))
        binding.bind_cpu_input(TOTAL, np.array(lengths.max() + 1, np.int32))
        session.run_with_iobinding(binding)
        seen.append(binding.get_outputs()[0].numpy()[:, -1, :].copy())  # ORT reuses the bound output
        lengths = lengths + 1
    return seen, time.perf_counter() - started


def greedy(decoder: DecoderGraph, prompts: list[list[int]], new: int) -> np.ndarray:
    logits, first = decoder.prefill(prompts)
    cache: KVCache | KVBuffer = first
    tokens = []
    for _ in range(new):
        tokens.append(logits.argmax(-1))
        logits, cache = decoder.decode(tokens[-1], cache)
    return np.stack(tokens, 1)  # (rows, new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a GPT folder with fp16 and fused graphs")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    folder, options = args.model, RuntimeOptions(device=args.device)
    manifest = read_manifest(folder)
    model = load_model(folder, RuntimeOptions(device="cpu"), check_hashes=False)
    assert model.tokenizer is not None
    prompts = [model.tokenizer.encode(p).ids for p in PROMPTS]
    fp32 = DecoderGraph(Graph(folder / fused_file(folder), options), manifest)
    fp16 = DecoderGraph(Graph(folder / manifest.variants["fp16"].graphs["model"], options), manifest)
    forced = greedy(fp32, prompts, args.new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        step = write_step_graph(folder, Path(tmp))
        ops = sorted({n.op_type for n in onnx.load(str(step)).graph.node})
        capacity = required(manifest.max_sequence_length)
        ways: dict[str, tuple[Logits, float | None]] = {
            "fp32_concat": stepwise(fp32, prompts, forced),
            "fp16_concat": stepwise(fp16, prompts, forced),
            "fp16_inplace": inplace(fp16, step, args.device, capacity, prompts, forced),
            "fp32_recompute": (recomputed(fp32, prompts, forced), None),
            "fp16_recompute": (recomputed(fp16, prompts, forced), None),
        }
    truth = np.stack(ways["fp32_recompute"][0], 1)  # (rows, steps, V)
    found: dict[str, object] = {
        "model": str(folder),
        "device": args.device,
        "provider": fp16.layout and Graph(folder / fused_file(folder), options).provider,
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": args.new_tokens,
        "logits_max_abs": float(np.abs(truth).max()),
        "step_graph_ops": ops,
        "ways": {},
    }
    for name, (seen, seconds) in ways.items():
        logits = np.stack(seen, 1)
        diff = np.abs(logits.astype(np.float64) - truth)
        found["ways"][name] = {  # type: ignore[index]
            "max_abs_diff_vs_fp32_recompute": float(diff.max()),
            "max_abs_diff_by_row": [float(d) for d in diff.max(axis=(1, 2))],
            "worst_step": int(diff.max(axis=(0, 2)).argmax()),
            "argmax_is_forced": float((logits.argmax(-1) == forced).mean()),
            "tokens_per_s": None if seconds is None else len(prompts) * args.new_tokens / seconds,
        }
    chosen = {n: np.stack(ways[n][0], 1).argmax(-1) for n in ("fp16_concat", "fp16_inplace")}
    found["same_tokens"] = bool(np.array_equal(chosen["fp16_concat"], chosen["fp16_inplace"]))
    print(json.dumps(found, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    inplace_diff = found["ways"]["fp16_inplace"]["max_abs_diff_vs_fp32_recompute"]  # type: ignore[index]
    concat_diff = found["ways"]["fp16_concat"]["max_abs_diff_vs_fp32_recompute"]  # type: ignore[index]
    return 0 if found["same_tokens"] and inplace_diff <= 2 * concat_diff + 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
