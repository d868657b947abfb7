"""(a) GPT decoding with the KV cache vs recomputing the whole prefix at every step.

In process, on the service's own ``DecoderGraph``: with the cache, one prefill of the prompt and
then one single-token step per new token; without it, the same graph with an empty past over the
whole sequence (prompt + tokens so far) at every step. Both decode greedily and must pick the same
tokens. One run of the longest N gives every N (the first N steps), timed per step; the per-token
latency against position is plotted for both. N is clipped to what ``max_sequence_length`` leaves
after the prompt (the default GPT holds 256 positions, so N = 256 and 512 become 255). The cached
side decodes as the service does: in place (``KVBuffer``; on CUDA the fp16 step graph over device
buffers, ``DeviceKVBuffer``) where the served variant has the step graph.

Then (b2) one decoding step of 16 rows over a 200-token past, the KV cache updated in place against
``Concat`` (the exported graphs' own step, which copies the past into a new tensor): the same rows,
the same tokens, interleaved repeats, and the logits of both compared.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/kv_cache.py` anywhere

import numpy as np

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Check, Result, display_path
from harness.stats import median, ratio
from service.engine.decoder_graph import DecoderGraph
from service.engine.device_kv import DeviceKVBuffer
from service.engine.kv_cache import KVBuffer
from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions

NAME = "kv_cache"
TITLE = "(a) KV cache: decoding N new tokens with the cache vs recomputing the prefix"
SIZES = (32, 128, 256, 512)
TARGET_256 = 10.0
PROMPT = "ROMEO:"
STEP_ROWS, STEP_PAST = 16, 200
BLOCK = 20  # steps timed together per mode and round
TARGET_INPLACE = 1.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per mode (default 3, quick 1)")
    parser.add_argument("--prompt", default=PROMPT, help="its first token is the prompt (1 token)")


def decode_cached(graph: DecoderGraph, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy: prefill the prompt (gives token 1), then n - 1 single-token steps; seconds per token."""
    times, tokens = [], []
    t0 = time.perf_counter()
    logits, prefilled = graph.prefill([prompt])  # (1, V)
    cache = graph.start(prefilled)  # a KVBuffer where the step runs in place
    token = int(np.argmax(logits[0]))
    times.append(time.perf_counter() - t0)
    tokens.append(token)
    for _ in range(n - 1):
        t0 = time.perf_counter()
        logits, cache = graph.decode(np.array([token], dtype=np.int64), cache)
        token = int(np.argmax(logits[0]))
        times.append(time.perf_counter() - t0)
        tokens.append(token)
    return tokens, times


def decode_recomputed(graph: DecoderGraph, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy without a cache: the whole sequence through the graph with an empty past, every step."""
    times, tokens = [], []
    sequence = list(prompt)
    for _ in range(n):
        t0 = time.perf_counter()
        logits, _ = graph.prefill([sequence])  # (1, V); the cache is discarded
        token = int(np.argmax(logits[0]))
        times.append(time.perf_counter() - t0)
        tokens.append(token)
        sequence.append(token)
    return tokens, times


def step_speedup(model: LoadedModel, repeats: int) -> dict[str, object]:
    """One decoding step of STEP_ROWS rows over a STEP_PAST-token past: in place vs Concat, medians in ms."""
    inplace = DecoderGraph(model.graphs["model"], model.manifest, model.inplace["model"])
    concat = DecoderGraph(model.graphs["model"], model.manifest)
    rng = np.random.default_rng(0)
    vocab = int(model.manifest.config["vocab_size"])
    past = min(STEP_PAST, required(model.manifest.max_sequence_length) - 1)
    prompts = [rng.integers(5, vocab, past).tolist() for _ in range(STEP_ROWS)]
    _, cache = concat.prefill(prompts)  # (16, H, 200, Dh) per layer
    buffer = inplace.start(cache)
    assert isinstance(buffer, KVBuffer | DeviceKVBuffer)  # on CUDA the buffers live on the device
    lengths = buffer.lengths.copy()
    tokens = rng.integers(5, vocab, STEP_ROWS)
    # Blocks of steps, the modes taking turns: the two modes are two ONNX Runtime sessions, each with
    # its own spinning thread pool, and a step right after the other session's pays for its spin.
    times: dict[str, list[float]] = {"inplace": [], "concat": []}
    logits: dict[str, np.ndarray] = {}
    for round in range(max(repeats, 1) * 4 + 1):  # the first round warms up
        t0 = time.perf_counter()
        for _ in range(BLOCK):
            logits["concat"], _ = concat.decode(tokens, cache)
        concat_s = (time.perf_counter() - t0) / BLOCK
        t0 = time.perf_counter()
        for _ in range(BLOCK):
            buffer.lengths = lengths.copy()  # the same 200-token past every time: the new column is rewritten
            logits["inplace"], _ = inplace.decode(tokens, buffer)
        inplace_s = (time.perf_counter() - t0) / BLOCK
        if round:
            times["concat"].append(concat_s)
            times["inplace"].append(inplace_s)
    ms = {mode: median(t) * 1e3 for mode, t in times.items()}
    return {
        "inplace_kv_step_rows": STEP_ROWS,
        "inplace_kv_step_past": past,
        "inplace_kv_step_ms": ms["inplace"],
        "concat_kv_step_ms": ms["concat"],
        "inplace_kv_step_speedup_16": ratio(ms["concat"], ms["inplace"]),
        "inplace_kv_step_max_abs_diff": float(np.abs(logits["inplace"] - logits["concat"]).max()),
        "inplace_kv_step_rounds": len(times["concat"]),
    }


def per_step_median(runs: list[list[float]]) -> list[float]:
    return [median(step) for step in zip(*runs, strict=True)]


def plot(path: Path, start: int, cached: list[float], recomputed: list[float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = np.arange(start, start + len(cached))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(positions, np.array(recomputed) * 1e3, label="no cache: recompute the prefix", color="tab:red")
    ax.plot(positions, np.array(cached) * 1e3, label="KV cache: one new token", color="tab:blue")
    ax.set_yscale("log")
    ax.set_xlabel("position of the generated token")
    ax.set_ylabel("latency per token (ms, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-generation")
    model = load_model(folder, RuntimeOptions(device=opts.device, intra_op_threads=opts.threads))  # type: ignore[arg-type]  # checked by argparse
    graph = DecoderGraph(model.graphs["model"], model.manifest, model.inplace.get("model"))
    assert model.tokenizer is not None
    prompt = model.tokenizer.encode(opts.extra.get("prompt") or PROMPT).ids[:1]
    max_context = required(model.manifest.max_sequence_length)
    longest = max_context - len(prompt)
    sizes = {n: min(n, longest) for n in SIZES}
    n_max = max(sizes.values())
    repeats = opts.extra.get("repeats") or (1 if opts.quick else 3)

    decode_cached(graph, prompt, min(8, n_max))  # warm-up: first runs pay for allocations
    decode_recomputed(graph, prompt, min(8, n_max))
    cached_runs, recomputed_runs = [], []
    cached_tokens: list[int] = []
    recomputed_tokens: list[int] = []
    for _ in range(repeats):  # interleaved, so drift on a shared machine hits both modes alike
        cached_tokens, times = decode_cached(graph, prompt, n_max)
        cached_runs.append(times)
        recomputed_tokens, times = decode_recomputed(graph, prompt, n_max)
        recomputed_runs.append(times)
    cached = per_step_median(cached_runs)
    recomputed = per_step_median(recomputed_runs)
    same = cached_tokens == recomputed_tokens
    first_diff = next(
        (i for i, (a, b) in enumerate(zip(cached_tokens, recomputed_tokens, strict=True)) if a != b), None
    )

    metrics: dict[str, object] = {
        "max_sequence_length": max_context,
        "prompt_tokens": len(prompt),
        "repeats": repeats,
        "same_tokens": same,
        "provider": model.provider,
        "variant": model.variant.name,
        "kv_cache": "inplace" if graph.in_place else "concat",
    }
    rows = [
        "| N asked | N decoded | with cache (ms) | ms/token | no cache (ms) | ms/token | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for asked, n in sizes.items():
        c, r = sum(cached[:n]), sum(recomputed[:n])
        speedup = ratio(r, c)
        metrics[f"kv_cache_speedup_{asked}"] = speedup
        metrics[f"kv_cache_n_{asked}"] = n
        metrics[f"kv_cache_ms_cached_{asked}"] = c * 1e3
        metrics[f"kv_cache_ms_recomputed_{asked}"] = r * 1e3
        clipped = " (clipped)" if n < asked else ""
        rows.append(
            f"| {asked} | {n}{clipped} | {c * 1e3:.1f} | {c / n * 1e3:.2f} | {r * 1e3:.1f} | "
            f"{r / n * 1e3:.2f} | {speedup:.1f}x |"
        )
    plot_path = opts.out_dir / "kv_cache_latency.png"
    plot(
        plot_path,
        len(prompt),
        cached,
        recomputed,
        f"{folder.name}: greedy decoding, {model.provider}, "
        + (f"{opts.threads} intra-op thread(s)" if opts.threads else "one intra-op thread per core"),
    )
    metrics["plot"] = str(plot_path)
    details = [
        *rows,
        "",
        f"Model `{folder.name}` ({model.variant.name} graphs, KV cache {metrics['kv_cache']}; "
        f"max_sequence_length {max_context}), a {len(prompt)}-token prompt, greedy; "
        f"N is clipped to {longest} (= max_sequence_length - prompt). Median per step over {repeats} "
        f"interleaved run(s). Cached and recomputed decoding chose "
        + ("the same tokens." if same else f"different tokens from position {first_diff} (float rounding)."),
        f"Per-token latency against position: `{display_path(plot_path)}`.",
    ]
    n256 = sizes[256]
    label = f"KV cache speedup, N=256{f' (clipped to {n256})' if n256 < 256 else ''}"
    checks = [Check(label, float(metrics["kv_cache_speedup_256"]), TARGET_256)]  # type: ignore[arg-type]
    if "model" in model.inplace:
        metrics.update(step_speedup(model, repeats))
        details += [
            "",
            f"(b2) One decoding step of {STEP_ROWS} rows over a {metrics['inplace_kv_step_past']}-token past, "
            f"median of {metrics['inplace_kv_step_rounds']} interleaved rounds of {BLOCK} steps per mode: in place "
            f"{metrics['inplace_kv_step_ms']:.2f} ms, Concat {metrics['concat_kv_step_ms']:.2f} ms "
            f"(**{metrics['inplace_kv_step_speedup_16']:.2f}x**); logits differ by at most "
            f"{metrics['inplace_kv_step_max_abs_diff']:.1e}.",
        ]
        checks.append(
            Check(
                f"in-place KV step over Concat, {STEP_ROWS} rows x {metrics['inplace_kv_step_past']} past",
                float(metrics["inplace_kv_step_speedup_16"]),  # type: ignore[arg-type]
                TARGET_INPLACE,
            )
        )
    else:
        details += ["", f"(b2) not measured: `{folder.name}`'s served variant has no in-place step graph."]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": model.provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
