"""An imported checkpoint against its own framework: the served graphs vs sentence-transformers, in process.

The sentence embedder imported from a Hugging Face checkpoint (``python -m model_export import DIR
--task feature-extraction``, docs/IMPORT.md; the benchmark takes the first feature-extraction folder of
``--models`` whose manifest has an ``origin``) embeds SST-2 validation sentences two ways, side by side
in interleaved rounds, on the same threads:

- sentence-transformers' ``SentenceTransformer.encode`` on the checkpoint folder (torch, what a user
  of the checkpoint runs), batches of 1 and 32;
- the graphs the service serves by default on this device (``RuntimeOptions.variant="auto"``: fused
  fp32 on CPU unless int8 passed the rule), with the service's tokenisation, padding and batching of
  the same sentences.

Both produce the same vectors (the import checked cosine >= 0.9999; the cosine is measured here again).
``imported_over_sentence_transformers_32``: texts/s of the served graphs over sentence-transformers'.
Not part of ``run_all.py`` (it needs an imported model): ``python benchmarks/imported.py --models DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/imported.py` anywhere

import numpy as np

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.options import Options
from benchmarks.results import Check, Result
from harness.stats import median
from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.pipelines.text_inputs import feeds_for, pad_batch, truncate

NAME = "imported"
TITLE = "Imported checkpoint: served graphs vs sentence-transformers, in process"
TARGET = 1.0  # the served graphs at least as fast as the framework the checkpoint came from

Workload = Callable[[], int]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--seconds", type=float, default=None, help="per workload and round (default 3)")


def _imported_embedder(models: Path) -> Path:
    for folder in sorted(p for p in models.iterdir() if (p / "manifest.json").is_file()):
        manifest = json.loads((folder / "manifest.json").read_text())
        if manifest.get("task") == "feature-extraction" and manifest.get("origin"):
            return folder
    raise SystemExit(f"{models} holds no imported feature-extraction model (python -m model_export import)")


def _throughput(work: Workload, seconds: float) -> float:
    work()
    items, started = 0, time.perf_counter()
    while True:
        items += work()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return items / elapsed


def _served(
    model: LoadedModel, texts: list[str], batch: int
) -> tuple[Workload, Callable[[list[str]], np.ndarray]]:
    assert model.tokenizer is not None
    graph = model.graphs["model"]
    spec = required(model.manifest.embedding)
    limit, pad = required(model.manifest.max_sequence_length), model.manifest.token("pad")

    def embed(chunk: list[str]) -> np.ndarray:
        assert model.tokenizer is not None
        rows = [truncate(e.ids, limit) for e in model.tokenizer.encode_batch(chunk)]
        return graph.run(feeds_for(graph, pad_batch(rows, pad)), [spec.normalized_output])[0]

    batches = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    state = {"i": 0}

    def work() -> int:
        chunk = batches[state["i"] % len(batches)]
        state["i"] += 1
        embed(chunk)
        return len(chunk)

    return work, embed


def _reference(st: object, texts: list[str], batch: int) -> Workload:
    batches = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    state = {"i": 0}

    def work() -> int:
        chunk = batches[state["i"] % len(batches)]
        state["i"] += 1
        st.encode(chunk, batch_size=batch, normalize_embeddings=True)  # type: ignore[attr-defined]
        return len(chunk)

    return work


def run(opts: Options) -> Result:
    import torch
    from sentence_transformers import SentenceTransformer

    load_before = _load_average()
    folder = _imported_embedder(opts.models)
    manifest = json.loads((folder / "manifest.json").read_text())
    checkpoint = Path(manifest["origin"]["folder"])
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    seconds = opts.extra.get("seconds") or (0.5 if opts.quick else 3.0)
    texts = sentiment_texts()[: 64 if opts.quick else 256]
    if opts.threads:
        torch.set_num_threads(opts.threads)
    options = RuntimeOptions(device=opts.device, intra_op_threads=opts.threads)  # type: ignore[arg-type]
    model = load_model(folder, options, check_hashes=False)
    st = SentenceTransformer(str(checkpoint), device="cpu")
    st.max_seq_length = required(model.manifest.max_sequence_length)
    served_32, embed = _served(model, texts, 32)
    cosine = float((embed(texts[:64]) * st.encode(texts[:64], normalize_embeddings=True)).sum(-1).min())
    workloads = {
        ("batch 1", "sentence-transformers"): _reference(st, texts[:64], 1),
        ("batch 1", f"served ({model.variant.name})"): _served(model, texts[:64], 1)[0],
        ("batch 32", "sentence-transformers"): _reference(st, texts, 32),
        ("batch 32", f"served ({model.variant.name})"): served_32,
    }
    measured: dict[tuple[str, str], list[float]] = {k: [] for k in workloads}
    for _ in range(rounds):
        for key, work in workloads.items():
            measured[key].append(_throughput(work, seconds))
    rates = {k: median(v) for k, v in measured.items()}
    ratio = {
        size: rates[(size, f"served ({model.variant.name})")] / rates[(size, "sentence-transformers")]
        for size in ("batch 1", "batch 32")
    }
    details = [
        f"{manifest['origin']['checkpoint']} ({manifest['origin']['architecture']}), imported as "
        f"`{folder.name}`; {len(texts)} SST-2 validation sentences; {rounds} interleaved rounds of "
        f"{seconds:g} s, median; min cosine served vs sentence-transformers {cosine:.6f}",
        "",
        "| batch | sentence-transformers texts/s | served texts/s | served / sentence-transformers |",
        "|---|---|---|---|",
    ]
    for size in ("batch 1", "batch 32"):
        details.append(
            f"| {size} | {rates[(size, 'sentence-transformers')]:.1f} | "
            f"{rates[(size, f'served ({model.variant.name})')]:.1f} | {ratio[size]:.2f}x |"
        )
    metrics = {
        "imported_over_sentence_transformers_1": ratio["batch 1"],
        "imported_over_sentence_transformers_32": ratio["batch 32"],
        "imported_min_cosine": cosine,
        "variant": model.variant.name,
    }
    checks = [Check("imported_over_sentence_transformers_32", ratio["batch 32"], TARGET)]
    details.append(
        f"\nThe machine's load average (1 minute) was {load_before} before and {_load_average()} after the run: "
        "other work on the same 2 cores slows both sides alike, round by round."
    )
    return Result(
        NAME, TITLE, metrics, checks, details, {"provider": model.provider, "variant": model.variant.name}
    )


def _load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__]))
