"""(h) Graph variants: raw ONNX Runtime throughput of the fp32 reference, the fused graphs and int8 (fp16 on CUDA).

In process, no HTTP: each model's variants (``python -m model_export variants``) are loaded with the
service's own loader (``RuntimeOptions.variant``) and run side by side on the same inputs, interleaved
round by round so drift on a shared machine hits every variant alike:

- bert-classifier: SST-2 validation sentences at batch 1 and 32 (tokenised once; pad + run + softmax);
- translator: Multi30k English sentences, greedy (beam 1) and beam 4, 8 sentences per call;
- GPT: greedy decoding of 32 new tokens, 1 stream and 16 streams (the service's ``DecoderGraph``);
- ViT: batches of 32 images (the pixel content does not change the work).

Next to the speed, each variant's validation metric and its difference from the reference, as the
export measured them (the manifest), and whether the service serves it by default (the accuracy rule).
``int8_classify_speedup_32`` is int8 over the fp32 reference, bert-classifier at batch 32.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/variants.py` anywhere

import numpy as np

from benchmarks.cli import main
from benchmarks.data import english_sentences, sentiment_texts, shakespeare_prompts
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Check, Result
from harness.stats import median, ratio
from service.engine.decoder_graph import DecoderGraph
from service.engine.manifest import Manifest, required
from service.engine.repository import LoadedModel, load_model, read_manifest
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import softmax
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.text_inputs import feeds_for, pad_batch, truncate
from service.pipelines.translate import prepare_source

NAME = "variants"
TITLE = "(h) Graph variants: raw ONNX Runtime throughput, fp32 reference vs fused vs int8 (fp16 on CUDA)"
TARGET_INT8_32 = 1.8
# The reduced-precision variant each device has: int8 matmuls on CPU, fp16 on CUDA.
LOW_PRECISION = {"cpu": "int8", "cuda": "fp16"}

Workload = Callable[[], int]  # runs once, returns the items it processed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--seconds", type=float, default=None, help="per workload and round (default 2)")


def _load(folder: Path, variant: str, opts: Options) -> LoadedModel:
    options = RuntimeOptions(device=opts.device, intra_op_threads=opts.threads, variant=variant)  # type: ignore[arg-type]
    return load_model(folder, options, check_hashes=False)


def _variants_of(manifest: Manifest, low: str) -> list[str]:
    return ["reference", *(v for v in ("fused", low) if v in manifest.variants)]


def _throughput(work: Workload, seconds: float) -> float:
    """Items per second over at least ``seconds`` (after one untimed call)."""
    work()
    items, started = 0, time.perf_counter()
    while True:
        items += work()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return items / elapsed


def _classifier_work(model: LoadedModel, texts: list[str], batch: int) -> Workload:
    assert model.tokenizer is not None
    graph = model.graphs["model"]
    limit, pad = required(model.manifest.max_sequence_length), model.manifest.token("pad")
    ids = [truncate(e.ids, limit) for e in model.tokenizer.encode_batch(texts)]
    batches = [ids[i : i + batch] for i in range(0, len(ids) - batch + 1, batch)]
    state = {"i": 0}

    def work() -> int:
        rows = batches[state["i"] % len(batches)]
        state["i"] += 1
        softmax(graph.session.run(None, feeds_for(graph, pad_batch(rows, pad)))[0])
        return len(rows)

    return work


def _translator_work(model: LoadedModel, sentences: list[str], beam: int) -> Workload:
    assert model.tokenizer is not None
    manifest = model.manifest
    seq2seq = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], manifest)
    # The served sources and default step limits, 8 sentences of similar length a call, each call
    # decoding as the service decodes a batch: one group per step limit.
    prepared = [
        prepare_source(manifest, e.ids, seq2seq.max_new_tokens)
        for e in model.tokenizer.encode_batch(sentences)
    ]
    prepared.sort(key=lambda p: len(p[0]))
    groups = [prepared[i : i + 8] for i in range(0, len(prepared) - 7, 8)]
    state = {"i": 0}

    def work() -> int:
        group = groups[state["i"] % len(groups)]
        state["i"] += 1
        by_limit: dict[int, list[list[int]]] = {}
        for source, budget, _ in group:
            by_limit.setdefault(budget, []).append(source)
        for budget, sources in by_limit.items():
            if beam == 1:
                seq2seq.greedy(sources, budget)
            else:
                seq2seq.beam_search(sources, beam, budget)
        return len(group)

    return work


def _gpt_work(model: LoadedModel, prompts: list[list[int]], streams: int, new_tokens: int) -> Workload:
    graph = DecoderGraph(model.graphs["model"], model.manifest)
    state = {"i": 0}

    def work() -> int:
        start = (state["i"] * streams) % max(len(prompts) - streams, 1)
        state["i"] += 1
        logits, cache = graph.prefill(prompts[start : start + streams])
        for _ in range(new_tokens - 1):
            tokens = np.argmax(logits, axis=-1).astype(np.int64)
            logits, cache = graph.decode(tokens, cache)
        return streams * new_tokens

    return work


def _vit_work(model: LoadedModel, batch: int) -> Workload:
    graph = model.graphs["model"]
    pre = required(model.manifest.preprocessing)
    channels = 1 if pre.color_mode in ("L", "grayscale") else 3
    pixels = np.random.default_rng(0).standard_normal((batch, channels, *pre.image_size)).astype(np.float32)
    name = graph.input_names[0]

    def work() -> int:
        graph.session.run(None, {name: pixels})
        return batch

    return work


def _workloads(models: Path, opts: Options) -> dict[str, tuple[Path, str, Callable[[LoadedModel], Workload]]]:
    """label -> (model folder, unit, workload builder)."""
    texts = sentiment_texts()[:256]
    sentences = english_sentences()[:64]
    quick = opts.quick
    gpt_folder = find_model(models, "text-generation")
    gpt_tokens = 8 if quick else 32

    def gpt_prompts(model: LoadedModel) -> list[list[int]]:
        assert model.tokenizer is not None
        return [e.ids for e in model.tokenizer.encode_batch(shakespeare_prompts(64))]

    return {
        "bert-classifier, batch 1": (
            find_model(models, "text-classification"),
            "texts/s",
            lambda m: _classifier_work(m, texts[:64], 1),
        ),
        "bert-classifier, batch 32": (
            find_model(models, "text-classification"),
            "texts/s",
            lambda m: _classifier_work(m, texts, 32),
        ),
        "translator, beam 1": (
            find_model(models, "translation"),
            "sentences/s",
            lambda m: _translator_work(m, sentences, 1),
        ),
        "translator, beam 4": (
            find_model(models, "translation"),
            "sentences/s",
            lambda m: _translator_work(m, sentences, 4),
        ),
        "GPT, 1 stream": (gpt_folder, "tokens/s", lambda m: _gpt_work(m, gpt_prompts(m), 1, gpt_tokens)),
        "GPT, 16 streams": (gpt_folder, "tokens/s", lambda m: _gpt_work(m, gpt_prompts(m), 16, gpt_tokens)),
        "ViT, batch 32": (find_model(models, "image-classification"), "images/s", lambda m: _vit_work(m, 32)),
    }


def _accuracy_rows(models: Path) -> list[str]:
    rows = [
        "| model | variant | metric | reference | variant | difference | allowed drop | served by default |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for folder in sorted(p for p in models.iterdir() if (p / "manifest.json").is_file()):
        manifest = read_manifest(folder)
        for name, v in manifest.variants.items():
            metric = v.metric or "-"
            value = (v.validation or {}).get(metric)
            delta = (v.delta or {}).get(metric)
            reference = value - delta if value is not None and delta is not None else None
            rows.append(
                f"| {folder.name} | {name} | {metric} | {_fmt(reference)} | {_fmt(value)} | {_fmt(delta, True)} | "
                f"{_fmt(v.tolerance)} | {'yes' if v.serve_by_default else 'no: ' + v.reason} |"
            )
    return rows


def _fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def run(opts: Options) -> Result:
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    seconds = opts.extra.get("seconds") or (0.3 if opts.quick else 2.0)
    table: dict[str, dict[str, list[float]]] = {}
    units: dict[str, str] = {}
    provider = ""
    low = LOW_PRECISION["cuda" if opts.device == "cuda" else "cpu"]
    for label, (folder, unit, build) in _workloads(opts.models, opts).items():
        variants = _variants_of(read_manifest(folder), low)
        loaded = {v: _load(folder, v, opts) for v in variants}
        provider = next(iter(loaded.values())).provider
        works = {v: build(m) for v, m in loaded.items()}
        found: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for v, work in works.items():
                found[v].append(_throughput(work, seconds))
        table[label], units[label] = found, unit
        print(f"  {label}: " + ", ".join(f"{v} {median(x):.1f}" for v, x in found.items()), flush=True)

    def speedup(label: str, variant: str) -> float | None:
        found = table.get(label, {})
        if variant not in found:
            return None
        return ratio(median(found[variant]), median(found["reference"]))

    low_32 = speedup("bert-classifier, batch 32", low)
    metrics: dict[str, Any] = {
        f"{low}_classify_speedup_32": low_32,
        "fused_classify_speedup_32": speedup("bert-classifier, batch 32", "fused"),
        "throughput": {label: {v: median(x) for v, x in found.items()} for label, found in table.items()},
        "provider": provider,
    }
    rows = [
        f"| workload | unit | fp32 reference | fused | vs reference | {low} | vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, found in table.items():
        ref = median(found["reference"])
        cells = [f"{ref:.1f}"]
        for v in ("fused", low):
            if v in found:
                cells += [f"{median(found[v]):.1f}", f"{ratio(median(found[v]), ref):.2f}x"]
            else:
                cells += ["-", "-"]
        rows.append(f"| {label} | {units[label]} | " + " | ".join(cells) + " |")
    details = [
        *rows,
        "",
        f"Medians of {rounds} interleaved round(s) of {seconds:g} s per workload and variant, ONNX Runtime "
        f"{provider}, INTRA_OP_THREADS={opts.threads} (0: one per core). Accuracy, as the export measured "
        "it on the validation split (the manifests):",
        "",
        *_accuracy_rows(opts.models),
        "",
    ]
    checks = []
    if low_32 is not None and low == "int8":
        checks.append(Check("int8 / fp32 classify throughput, batch 32", low_32, TARGET_INT8_32))
    return Result(NAME, TITLE, metrics, checks, details, context={"provider": provider})


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__]))
