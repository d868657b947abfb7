"""(m) IO binding on CUDA: GPT decoding with the KV cache kept on the GPU vs copied through the host each step.

In process, no HTTP. The served GPT graph on CUDA decodes greedily from Tiny Shakespeare prompts, at 1
and 16 streams, two ways on the same session:

- IO binding (what the service does, ``decoder_graph.cuda_step``): each step's present keys and values
  stay on the device and are bound as the next step's past; only the logits come to the host;
- plain ``session.run`` (``decoder_graph.host_step``): the cache goes to the GPU and back every step.

Interleaved round by round; both must produce the same tokens (checked). Needs CUDA: skipped elsewhere.
``io_binding_speedup_16`` is IO binding's tokens/s over plain ``run``'s at 16 streams.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/io_binding.py` anywhere

import numpy as np

from benchmarks.cli import main
from benchmarks.data import shakespeare_prompts
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Check, Result
from harness.stats import median, ratio
from service.engine.decoder_graph import DecoderGraph, host_step
from service.engine.repository import load_model
from service.engine.runtime import CUDA, RuntimeOptions

NAME = "io_binding"
TITLE = "(m) IO binding on CUDA: KV cache kept on the GPU vs copied through the host each step"
STREAMS = (1, 16)
TARGET_16 = 1.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--new-tokens", type=int, default=None, help="per stream (default 64, quick 8)")


def skip_reason(opts: Options) -> str | None:
    return None if opts.device in ("cuda", "auto") else "IO binding is the CUDA path: run with --device cuda"


def _decode(decoder: DecoderGraph, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
    """Greedy decoding of every prompt at once; returns the tokens (rows, new_tokens)."""
    logits, cache = decoder.prefill(prompts)
    state = decoder.start(cache)
    tokens = []
    for _ in range(new_tokens):
        chosen = logits.argmax(-1)
        tokens.append(chosen)
        logits, state = decoder.decode(chosen, state)
    return np.stack(tokens, 1)


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-generation")
    options = RuntimeOptions(device=opts.device, intra_op_threads=opts.threads)  # type: ignore[arg-type]
    model = load_model(folder, options, check_hashes=False)
    graph = model.graphs["model"]
    if graph.provider != CUDA:
        raise RuntimeError(f"GPT landed on {graph.provider}: IO binding is measured on CUDA only")
    assert model.tokenizer is not None
    bound = DecoderGraph(graph, model.manifest)  # on CUDA: cuda_step, the cache stays on the device
    plain = DecoderGraph(graph, model.manifest)
    plain._step = host_step(graph, plain.layout)  # the same graph, the cache through numpy every step
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    new_tokens = opts.extra.get("new_tokens") or (8 if opts.quick else 64)
    prompts = [e.ids[:24] for e in model.tokenizer.encode_batch(shakespeare_prompts(64))]
    metrics: dict[str, object] = {"new_tokens": new_tokens, "rounds": rounds, "variant": model.variant.name}
    rows = [
        "| streams | IO binding: tokens/s | plain run: tokens/s | IO binding / plain |",
        "|---|---|---|---|",
    ]
    for streams in STREAMS:
        batch = prompts[:streams]
        same = np.array_equal(
            _decode(bound, batch, new_tokens), _decode(plain, batch, new_tokens)
        )  # warm-up too
        found: dict[str, list[float]] = {"bound": [], "plain": []}
        for _ in range(rounds):
            for mode, decoder in (("bound", bound), ("plain", plain)):
                started = time.perf_counter()
                _decode(decoder, batch, new_tokens)
                found[mode].append(streams * new_tokens / (time.perf_counter() - started))
        speed = {mode: median(values) for mode, values in found.items()}
        metrics[f"io_binding_speedup_{streams}"] = ratio(speed["bound"], speed["plain"])
        metrics[f"io_binding_tokens_per_s_{streams}"] = speed["bound"]
        metrics[f"plain_run_tokens_per_s_{streams}"] = speed["plain"]
        metrics[f"same_tokens_{streams}"] = same
        rows.append(
            f"| {streams} | {speed['bound']:.0f} | {speed['plain']:.0f} | "
            f"{metrics[f'io_binding_speedup_{streams}']:.2f}x{'' if same else ' (tokens differ!)'} |"
        )
    details = [
        *rows,
        "",
        f"GPT ({model.variant.name} graphs) on {graph.provider}, greedy, {new_tokens} new tokens per stream from "
        f"24-token prompts; medians of {rounds} interleaved round(s) after one warm-up decode, which also "
        "checks that both ways produce the same tokens.",
    ]
    checks = [
        Check(
            "IO binding / plain run, GPT decoding, 16 streams",
            float(metrics["io_binding_speedup_16"]),  # type: ignore[arg-type]
            TARGET_16,
        )
    ]  # type: ignore[arg-type]
    return Result(NAME, TITLE, metrics, checks, details, context={"provider": graph.provider})


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__]))
