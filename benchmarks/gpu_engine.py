"""(g) The engine's CUDA choices, each against the simplest one, side by side in one process.

- GPT decoding, generated tokens/s at 1, 16 and 64 rows: the exported Concat decoder with IO binding (the
  cache stays on the device between steps, a new tensor each step) against the in-place step graph over
  device buffers (``DeviceKVBuffer``), without and with CUDA graphs (the batch padded to a bucket, each
  bucket's kernels replayed with one launch); the ways take turns, the median of the rounds;
- the same buffers through joins and leaves: milliseconds to join 8 prefilled rows and to drop every other
  row of 64, on the device;
- the encoders (the classifier at batch 1, 8 and 32; ViT at 32): plain CUDA against CUDA graphs at padded
  shapes and against TensorRT (fp16, engine cache on disk), with each one's start-up (the session made, the
  first batch answered; TensorRT twice: building its engine, then loading it from the cache);
- pinned host memory: whether ONNX Runtime's Python API gives a host-accessible (pinned) allocator for
  CUDA, and a (64, vocab) float32 copy from the device into it against into pageable memory.

On a machine without CUDA (``--device cpu``, the dry run) the CPU counterparts run (device buffers on
ONNX Runtime's CPU provider, plain encoders) and the CUDA-only ways say why they were left out.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/gpu_engine.py` anywhere

import numpy as np

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Result
from harness.stats import ratio
from service.engine.decoder_graph import DecoderGraph
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import CUDA, Graph, RuntimeOptions, ort

NAME = "gpu_engine"
TITLE = "(g) The engine on CUDA: device KV buffers, CUDA graphs, TensorRT, pinned memory, side by side"
ROWS = (1, 16, 64)
STEPS = 48
PROMPT_TOKENS = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="rounds per way (default 3, quick 1)")
    parser.add_argument("--rows", type=int, nargs="+", default=None, help=f"GPT batch sizes (default {ROWS})")


def tensorrt_libraries() -> str | None:
    """None where TensorRT's libraries load, else why not."""
    try:
        ctypes.CDLL("libnvinfer.so.10")
        ctypes.CDLL("libnvonnxparser.so.10")
    except OSError as exc:
        return f"TensorRT's libraries are not on this machine ({exc})"
    return None


def decoders(model: LoadedModel, folder: Path, device: str, max_rows: int) -> dict[str, DecoderGraph | str]:
    """The ways to decode, or why one is left out."""
    graph, manifest = model.graphs["model"], model.manifest
    ways: dict[str, DecoderGraph | str] = {"concat": DecoderGraph(graph, manifest)}
    step = model.inplace.get("model")
    if step is None:
        reason = f"{model.variant.name} has no in-place step graph on {device} (pack.py adds GPT's fp16 one)"
        return {**ways, "device": reason, "device_graphs": reason}
    ways["device"] = DecoderGraph(graph, manifest, step, max_rows=max_rows, device_buffers=True)
    if device != "cuda":
        ways["device_graphs"] = "CUDA graphs need CUDA"
        return ways
    captured = Graph(step.path, RuntimeOptions(device="cuda", cuda_graphs=True))
    if not captured.cuda_graph:
        ways["device_graphs"] = "ONNX Runtime refused a CUDA graph for the step graph (see the log)"
        return ways
    ways["device_graphs"] = DecoderGraph(graph, manifest, captured, max_rows=max_rows, device_buffers=True)
    return ways


def decode_tokens_per_s(graph: DecoderGraph, prompts: list[list[int]], steps: int) -> float:
    logits, first = graph.prefill(prompts)
    cache = graph.start(first)
    tokens = logits.argmax(-1)
    started = time.perf_counter()
    for _ in range(steps):
        logits, cache = graph.decode(tokens, cache)
        tokens = logits.argmax(-1)
    return len(prompts) * steps / (time.perf_counter() - started)


def moves_ms(graph: DecoderGraph, prompts: list[list[int]], rounds: int) -> dict[str, float]:
    """Joining 8 prefilled rows to 56, and dropping every other row of 64, on the buffers' device."""
    join, leave = [], []
    _, eight = graph.prefill(prompts[:8])
    for _ in range(rounds):
        _, first = graph.prefill(prompts[:56])
        cache = graph.start(first)
        started = time.perf_counter()
        cache = cache.extend(eight)
        cache.lengths.sum()  # the moves are synchronous runs: done when they return
        join.append(time.perf_counter() - started)
        started = time.perf_counter()
        cache.keep(list(range(0, 64, 2)))
        leave.append(time.perf_counter() - started)
    return {"join_8_ms": statistics.median(join) * 1e3, "leave_32_of_64_ms": statistics.median(leave) * 1e3}


def gpt_table(opts: Options, metrics: dict[str, object], rounds: int) -> list[str]:
    folder = find_model(opts.models, "text-generation")
    device = "cuda" if opts.device == "cuda" else "cpu"
    model = load_model(folder, RuntimeOptions(device=device))  # type: ignore[arg-type]
    fp16 = model.manifest.variants.get("fp16")
    if device == "cpu" and not model.inplace and fp16 is not None and fp16.inplace_decode:
        # No GPU (the dry run): the fp16 graphs on ONNX Runtime's CPU provider, whose GroupQueryAttention
        # takes float16 too, so that the device-buffer path runs as it will on CUDA.
        cpu = RuntimeOptions(device="cpu")
        model = dataclasses.replace(
            model,
            graphs={"model": Graph(folder / fp16.graphs["model"], cpu)},
            inplace={"model": Graph(folder / fp16.inplace_decode["model"], cpu)},
        )
    rows = opts.extra.get("rows") or ([1, 4] if opts.quick else list(ROWS))
    steps = 8 if opts.quick else STEPS
    ways = decoders(model, folder, device, max(rows))
    vocab = int(model.manifest.config.get("vocab_size") or 100)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, vocab, PROMPT_TOKENS).tolist() for _ in range(max(max(rows), 64))]
    found: dict[str, dict[int, list[float]]] = {
        w: {n: [] for n in rows} for w, g in ways.items() if not isinstance(g, str)
    }
    for graph in found:  # warm-up: first runs allocate, captures happen
        for n in rows:
            decode_tokens_per_s(ways[graph], prompts[:n], 4)  # type: ignore[arg-type]
    for _ in range(rounds):
        for n in rows:
            for way in found:
                found[way][n].append(decode_tokens_per_s(ways[way], prompts[:n], steps))  # type: ignore[arg-type]
    lines = [
        "| rows | "
        + " | ".join(f"{w} tokens/s" for w in found)
        + " | device / concat | device+graphs / concat |",
        "|---|" + "---|" * (len(found) + 2),
    ]
    for n in rows:
        tps = {w: statistics.median(found[w][n]) for w in found}
        for w, value in tps.items():
            metrics[f"gpt_{w}_tokens_per_s_{n}"] = value
        over = {w: ratio(tps[w], tps["concat"]) for w in tps if w != "concat"}
        for w, value in over.items():
            metrics[f"gpt_{w}_over_concat_{n}"] = value
        cells = " | ".join(f"{tps[w]:.0f}" for w in found)
        device_over = f"{over['device']:.2f}x" if "device" in over else "-"
        graphs_over = f"{over['device_graphs']:.2f}x" if "device_graphs" in over else "-"
        lines.append(f"| {n} | {cells} | {device_over} | {graphs_over} |")
    for way, chosen in ways.items():
        if isinstance(chosen, str):
            metrics[f"gpt_{way}"] = f"left out: {chosen}"
            lines.append(f"- {way}: left out: {chosen}")
    device_way = ways.get("device")
    if isinstance(device_way, DecoderGraph) and max(rows) >= 8:
        moved = moves_ms(device_way, prompts, rounds)
        metrics.update({f"gpt_device_{k}": v for k, v in moved.items()})
        lines.append(
            f"- device buffers: joining 8 prefilled rows to 56 took {moved['join_8_ms']:.2f} ms, dropping every "
            f"other row of 64 {moved['leave_32_of_64_ms']:.2f} ms (median of {rounds})"
        )
    lines.append(
        f"- `{folder.name}` ({model.variant.name} graphs, {model.provider}), {PROMPT_TOKENS}-token prompts, {steps} "
        f"greedy steps timed per point after a warm-up; median of {rounds} round(s), the ways taking turns."
    )
    return lines


def encoder_rates(model: LoadedModel, batches: list[int], rounds: int, image: bool) -> dict[int, float]:
    graph = model.graphs["model"]
    rng = np.random.default_rng(1)
    vocab = model.tokenizer.get_vocab_size() if model.tokenizer is not None else 1000
    rates = {}
    for rows in batches:
        feeds: dict[str, np.ndarray]
        if image:
            feeds = {graph.input_names[0]: rng.standard_normal((rows, 1, 28, 28)).astype(np.float32)}
        else:
            ids = rng.integers(5, vocab, (rows, 24)).astype(np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids),
            }
            feeds = {n: feeds[n] for n in graph.input_names}
        graph.run(feeds)  # warm-up (and a capture where CUDA graphs are on)
        times = []
        for _ in range(max(rounds, 1) * 5):
            started = time.perf_counter()
            graph.run(feeds)
            times.append(time.perf_counter() - started)
        rates[rows] = rows / statistics.median(times)
    return rates


def encoder_table(opts: Options, metrics: dict[str, object], rounds: int) -> list[str]:
    device = "cuda" if opts.device == "cuda" else "cpu"
    lines = ["| model | way | start-up s | " + "items/s at batch 1 | 8 | 32 |", "|---|---|---|---|---|---|"]
    trt_missing = tensorrt_libraries()
    cache = Path(tempfile.mkdtemp(prefix="trt-cache-"))
    for task, image in (("text-classification", False), ("image-classification", True)):
        folder = find_model(opts.models, task)
        batches = [32] if image else [1, 8, 32]
        ways: dict[str, RuntimeOptions | str] = {"plain": RuntimeOptions(device=device)}  # type: ignore[arg-type]
        ways["cuda_graphs"] = (
            RuntimeOptions(device="cuda", cuda_graphs=True) if device == "cuda" else "CUDA graphs need CUDA"
        )
        if device != "cuda":
            ways["tensorrt_build"] = ways["tensorrt_cached"] = "TensorRT needs CUDA"
        elif trt_missing:
            ways["tensorrt_build"] = ways["tensorrt_cached"] = trt_missing
        else:
            trt = RuntimeOptions(device="cuda", tensorrt=True, tensorrt_cache_dir=str(cache / folder.name))
            ways["tensorrt_build"] = ways["tensorrt_cached"] = trt
        for way, options in ways.items():
            if isinstance(options, str):
                metrics[f"{folder.name}_{way}"] = f"left out: {options}"
                lines.append(f"| {folder.name} | {way} | left out: {options} | | | |")
                continue
            started = time.perf_counter()
            model = load_model(folder, options)
            first = encoder_rates(model, batches[:1], 0, image)  # the first batch answered
            startup = time.perf_counter() - started
            del first
            rates = encoder_rates(model, batches, rounds, image)
            provider = model.graphs["model"].provider
            metrics[f"{folder.name}_{way}_startup_s"] = startup
            metrics[f"{folder.name}_{way}_provider"] = provider
            for rows, value in rates.items():
                metrics[f"{folder.name}_{way}_per_s_{rows}"] = value
            cells = " | ".join(f"{rates[b]:.0f}" if b in rates else "" for b in (1, 8, 32))
            lines.append(
                f"| {folder.name} | {way} ({provider}, {model.variant.name}) | {startup:.2f} | {cells} |"
            )
            model.free()
    lines.append(
        "- start-up: the model loaded and its first batch answered (TensorRT builds its engine then, or loads "
        "it from the cache on disk: `_build` then `_cached`); rates: the median of timed runs of one batch of "
        "24-token texts (ViT: random 28x28 images)."
    )
    return lines


def pinned_memory(opts: Options, metrics: dict[str, object]) -> list[str]:
    """Whether ONNX Runtime's Python API gives pinned host memory for CUDA, and what it buys for the logits."""
    if opts.device != "cuda":
        metrics["pinned"] = "left out: needs CUDA"
        return ["- pinned host memory: left out (needs CUDA)"]
    devices = [d for d in ort.get_ep_devices() if d.ep_name == CUDA]
    if not devices:
        why = (
            "ort.get_ep_devices() lists no CUDA device: this onnxruntime-gpu build's CUDA provider is not a "
            "plugin EP, and OrtValue.ortvalue_from_shape_and_type(memory_info=...) is the only way the Python "
            "API allocates host-accessible (pinned) memory"
        )
        metrics["pinned"] = f"unavailable: {why}"
        return [f"- pinned host memory: unavailable: {why}"]
    info = devices[0].memory_info(ort.OrtDeviceMemoryType.HOST_ACCESSIBLE)
    shape = [64, 2048]
    source = ort.OrtValue.ortvalue_from_numpy(np.ones(shape, np.float32), "cuda", 0)
    pinned = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, memory_info=info)
    times: dict[str, list[float]] = {"pageable": [], "pinned": []}
    for _ in range(50):
        started = time.perf_counter()
        source.numpy()
        times["pageable"].append(time.perf_counter() - started)
        started = time.perf_counter()
        pinned.update_inplace(source)
        pinned.numpy()
        times["pinned"].append(time.perf_counter() - started)
    us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    metrics.update({f"logits_copy_{k}_us": v for k, v in us.items()})
    return [
        f"- (64, 2048) float32 logits to the host: pageable {us['pageable']:.0f} us, pinned {us['pinned']:.0f} us"
    ]


def run(opts: Options) -> Result:
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    metrics: dict[str, object] = {"device": opts.device, "onnxruntime": ort.__version__}
    details = ["GPT decoding (generated tokens/s):", "", *gpt_table(opts, metrics, rounds), ""]
    details += ["Encoders:", "", *encoder_table(opts, metrics, rounds), ""]
    details += pinned_memory(opts, metrics)
    provider = CUDA if opts.device == "cuda" else "CPUExecutionProvider"
    return Result(NAME, TITLE, metrics, [], details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
