"""(c) Served throughput vs raw in-process ONNX Runtime on the same batches: the service's overhead.

Served: the real service (``serve_probe.py``: ``python -m service`` plus a log of every batch the
classifier runs) at MAX_BATCH_SIZE=32, driven by 64 closed-loop clients sending one SST-2 sentence
each (``Cache-Control: no-cache, no-store``), so that a full batch is always waiting while one computes.
Raw: the batches that server formed, replayed in process with the same texts, the same ONNX Runtime
settings and nothing else: tokenise (batch encode + truncation), pad, ``session.run``, softmax.
served/raw < 1 is what HTTP, JSON, the queue and the event loop cost on top of the model.

The two sides take turns: each round serves for a window, then replays the model calls of that
window while the server idles; the figure is the median of the rounds' ratios. Measured one after
the other (one served window, then the raw replay), the ratio of the same build moved between 0.71
and 0.93 within an hour on a 2-core EPYC VM, because the machine's own speed drifts by 10-15%.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/overhead.py` anywhere

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import BYPASS_CACHE, RequestFn, closed_loop, merge_points
from benchmarks.options import BENCH_DIR, PYTHON, Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.stats import median, ratio
from service.engine.manifest import required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import softmax
from service.pipelines.text_inputs import feeds_for, pad_batch, truncate
from service.settings import Settings

NAME = "overhead"
TITLE = "(c) Service overhead: served classify throughput vs raw ONNX Runtime on the same batches"
TARGET = 0.85


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=None, help="served seconds in all (default 24, quick 0.5)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="served / raw turns (default 6, quick 1)")
    parser.add_argument("--concurrency", type=int, default=64, help="clients (default 64)")
    parser.add_argument(
        "--passes", type=int, default=None, help="raw replays per round, median (default 3, quick 1)"
    )


def classify_request(texts: list[str]) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        response = await conn.request("POST", "/v1/classify", {"text": texts[i % len(texts)]}, BYPASS_CACHE)
        return response.status, {}

    return request


class RawClassifier:
    """What the service does per batch, without the service: encode, truncate, pad, run, softmax."""

    def __init__(self, model: LoadedModel) -> None:
        assert model.tokenizer is not None
        self.tokenizer = model.tokenizer
        self.graph = model.graphs["model"]
        self.max_len = required(model.manifest.max_sequence_length)
        self.pad_id = model.manifest.token("pad")

    def ids(self, texts: list[str]) -> list[list[int]]:
        return [truncate(e.ids, self.max_len) for e in self.tokenizer.encode_batch(texts)]

    def run(self, texts: list[str]) -> float:
        """Seconds for one batch, tokenisation included."""
        t0 = time.perf_counter()
        feeds = feeds_for(self.graph, pad_batch(self.ids(texts), self.pad_id))
        softmax(self.graph.session.run(None, feeds)[0])
        return time.perf_counter() - t0

    def run_ids(self, ids: list[list[int]]) -> float:
        """Seconds for one batch, model only (pad + run + softmax)."""
        t0 = time.perf_counter()
        feeds = feeds_for(self.graph, pad_batch(ids, self.pad_id))
        softmax(self.graph.session.run(None, feeds)[0])
        return time.perf_counter() - t0


def _new_batches(batch_log: Path, offset: int) -> tuple[list[list[list[int]]], int]:
    """The batches the server logged since ``offset`` (bytes), and the new offset."""
    with batch_log.open("rb") as f:
        f.seek(offset)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]  # a line being written stays for the next round
    lines = complete.decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()], offset + len(complete)


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-classification")
    duration = opts.extra.get("duration") or (0.5 if opts.quick else 24.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 6)
    concurrency = opts.extra.get("concurrency") or 64
    passes = opts.extra.get("passes") or (1 if opts.quick else 3)
    texts = sentiment_texts()
    # The raw side: the same model, files and ONNX Runtime options as the server (INTRA_OP_SPINNING as
    # the server reads it from the same environment), in this process.
    spinning = Settings().intra_op_spinning
    options = RuntimeOptions(device=opts.device, intra_op_threads=opts.threads, spinning=spinning)  # type: ignore[arg-type]
    raw = RawClassifier(load_model(folder, options))
    by_ids = {tuple(ids): text for text, ids in zip(texts, raw.ids(texts), strict=True)}
    for text in texts[:3]:  # warm-up
        raw.run([text])
    window = duration / rounds
    served_points, rows, sizes = [], [], []
    ratios, raw_rates, model_rates = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        batch_log = Path(tmp) / "batches.jsonl"
        batch_log.touch()
        with subset_repository([folder]) as repo:
            server = benchmark_server(
                repo,
                opts,
                env={"MAX_BATCH_SIZE": "32", "BENCH_BATCH_LOG": str(batch_log)},
                command=[PYTHON, str(BENCH_DIR / "serve_probe.py")],
            )
            with server:
                provider = providers(server)
                offset = 0
                for r in range(rounds):
                    # Served and raw take turns, round by round, so that the machine's drift (tens of
                    # percent over minutes on a shared VM) hits both sides of each ratio alike.
                    served = run_async(
                        closed_loop(
                            server,
                            concurrency,
                            classify_request(texts),
                            duration_s=window,
                            warmup_s=0.2 if opts.quick else (1.0 if r == 0 else 0.5),
                        )
                    )
                    batches, offset = _new_batches(batch_log, offset)
                    replay = [
                        [by_ids[tuple(ids)] for ids in batch]
                        for batch in batches
                        if all(tuple(i) in by_ids for i in batch)
                    ]
                    replay_ids = [raw.ids(b) for b in replay]
                    items = sum(map(len, replay))
                    raw_rps = median([ratio(items, sum(raw.run(b) for b in replay)) for _ in range(passes)])
                    model_rps = median(
                        [ratio(items, sum(raw.run_ids(b) for b in replay_ids)) for _ in range(passes)]
                    )
                    served_points.append(served)
                    ratios.append(ratio(served.rps, raw_rps))
                    raw_rates.append(raw_rps)
                    model_rates.append(model_rps)
                    sizes += [len(b) for b in replay]
                    rows.append(
                        f"| {r + 1} | {served.rps:.1f} | {raw_rps:.1f} | {model_rps:.1f} | {ratios[-1]:.2f} | "
                        f"{len(replay)} | {ratio(items, len(replay)):.1f} |"
                    )
    served = merge_points(served_points)
    served_over_raw = median([r for r in ratios if not math.isnan(r)])  # nan: no replayable call
    metrics: dict[str, object] = {
        "served_over_raw": served_over_raw,
        "served_over_raw_by_round": ratios,
        "served_rps": served.rps,
        "raw_rps": median(raw_rates),
        "raw_model_only_rps": median(model_rates),
        "mean_batch_size": ratio(sum(sizes), len(sizes)),
        "batches_replayed": len(sizes),
        "served_errors": served.errors,
        "server_cores": served.server_cpu_s / served.seconds if served.seconds else float("nan"),
    }
    hist = {s: sizes.count(s) for s in sorted(set(sizes))}
    top = ", ".join(f"{s}: {n}" for s, n in sorted(hist.items(), key=lambda kv: -kv[1])[:6])
    details = [
        f"| round | served over HTTP ({concurrency} clients, MAX_BATCH_SIZE=32): texts/s | raw: tokenise + "
        "pad + session.run + softmax, same batches | raw model only: pad + session.run + softmax | "
        "served / raw | model calls | mean call size |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Model `{folder.name}`; served / raw is the median of the {rounds} rounds' ratios: **{served_over_raw:.2f}**. "
        f"Each round serves for {window:g} s, then replays in process exactly the model calls (sub-batches after "
        f"the length split) the server formed in that round (its warm-up's included: a rate is compared), with the same texts, {passes} pass(es); the server "
        f"idles meanwhile. Most frequent call sizes: {top}. Served: p50 {served.p(50) * 1e3:.1f} ms, p95 "
        f"{served.p(95) * 1e3:.1f} ms, {served.errors} non-200; server process busy "
        f"{cores_used(served.server_cpu_s, served.seconds)} cores, client "
        f"{cores_used(served.client_cpu_s, served.seconds)} cores.",
    ]
    checks = [Check("Served / raw ONNX Runtime throughput", served_over_raw, TARGET)]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
