"""Documents for the translator: what splitting a paragraph into sentences costs in quality and buys in speed.

(a) BLEU on paragraphs of 3-5 consecutive Multi30k validation sentences (a seeded draw of the lengths, the
    whole split), the German references joined the same way: the served split-and-join path (one request
    per paragraph, ``split_sentences`` on, the default) against the same sentences translated one by one
    (one request per sentence, joined with a space), and the paragraph sent whole, unsplit, as the service
    translated it before (cut at ``max_source_length``). Greedy search, the service's default. The goal:
    split-and-join within 0.5 BLEU of one by one. Also how many paragraphs the segmenter split into exactly
    their sentences.
(b) Throughput at 8 closed-loop clients: a 5-sentence paragraph per request against single sentences per
    request, in sentences translated per second (a paragraph's sentences are batched together, so its
    request should cost about what 5 single requests cost, not 5 queue waits in a row). Two rounds taking
    turns, summed.
(c) The segmenter's choice: sentencex (served) against pysbd, when pysbd is importable (not a dependency):
    paragraphs split exactly into their sentences, and the time per paragraph, in process.

One server with the translation model, ``Cache-Control: no-cache, no-store`` on every request.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/documents.py` anywhere

from benchmarks.cli import main
from benchmarks.data import data_dir
from benchmarks.load import BYPASS_CACHE, LoadPoint, closed_loop, merge_points
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import ratio

NAME = "documents"
TITLE = "Documents: paragraphs split into sentences, BLEU and throughput"
TARGET_BLEU_GAP = 0.5
CLIENTS = 8
SEED = 63


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--paragraphs", type=int, default=None, help="validation paragraphs for BLEU (default all, quick 20)"
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="seconds per throughput window (default 8, quick 1)"
    )


def pairs() -> list[tuple[str, str]]:
    root = data_dir()
    if root is None:
        sys.exit("error: no data folder (DATA_DIR or ../shared/data): the BLEU needs Multi30k's validation")
    read = []
    for lang in ("en", "de"):
        with gzip.open(root / "multi30k" / f"validation.{lang}.gz", "rt", encoding="utf-8") as f:
            read.append([line.strip() for line in f])
    return [(en, de) for en, de in zip(*read, strict=True) if en and de]


def paragraphs(sentences: list[tuple[str, str]], limit: int | None) -> list[list[tuple[str, str]]]:
    """Consecutive runs of 3-5 sentences (lengths drawn with a fixed seed), the split covered once."""
    rng, i = random.Random(SEED), 0
    out: list[list[tuple[str, str]]] = []
    while i < len(sentences) and (limit is None or len(out) < limit):
        n = rng.randint(3, 5)
        out.append(sentences[i : i + n])
        i += n
    return out


async def _translate(conn: HTTPConnection, body: dict[str, Any]) -> dict[str, Any]:
    response = await conn.request("POST", "/v1/translate", body, BYPASS_CACHE)
    if response.status != 200:
        raise RuntimeError(f"/v1/translate answered {response.status}: {response.body[:300]!r}")
    return dict(response.json())


async def _all(server: ServiceProcess, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every body answered, by CLIENTS connections taking the next one in turn; answers in order."""
    answers: list[dict[str, Any]] = [{} for _ in bodies]
    queue = iter(range(len(bodies)))

    async def client() -> None:
        conn = HTTPConnection("127.0.0.1", server.port, timeout_s=300)
        try:
            for i in queue:
                answers[i] = await _translate(conn, bodies[i])
        finally:
            await conn.close()

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return answers


def bleu(server: ServiceProcess, paras: list[list[tuple[str, str]]]) -> dict[str, Any]:
    import sacrebleu

    references = [" ".join(de for _, de in p) for p in paras]
    texts = [" ".join(en for en, _ in p) for p in paras]
    sentences = [en for p in paras for en, _ in p]
    found: dict[str, Any] = {}
    started = time.perf_counter()
    split = run_async(_all(server, [{"text": t} for t in texts]))
    found["split_s"] = time.perf_counter() - started
    started = time.perf_counter()
    alone = run_async(_all(server, [{"text": s, "split_sentences": False} for s in sentences]))
    found["alone_s"] = time.perf_counter() - started
    whole = run_async(_all(server, [{"text": t, "split_sentences": False} for t in texts]))
    joined, at = [], 0
    for p in paras:
        joined.append(" ".join(a["results"][0]["text"] for a in alone[at : at + len(p)]))
        at += len(p)
    hyps = {
        "split": [a["results"][0]["text"] for a in split],
        "alone": joined,
        "whole": [a["results"][0]["text"] for a in whole],
    }
    for name, h in hyps.items():
        found[f"bleu_{name}"] = sacrebleu.corpus_bleu(h, [references]).score
    found["exact_split"] = sum(
        a["results"][0]["sentences"] == len(p) for a, p in zip(split, paras, strict=True)
    )
    found["same_text"] = sum(a == b for a, b in zip(hyps["split"], hyps["alone"], strict=True))
    found["truncated_whole"] = sum(bool(a["results"][0]["truncated"]) for a in whole)
    found["paragraphs"], found["sentences"] = len(paras), len(sentences)
    return found


def throughput(
    server: ServiceProcess, paras: list[list[tuple[str, str]]], seconds: float
) -> dict[str, LoadPoint]:
    fives = [" ".join(en for en, _ in p[:5]) for p in paras if len(p) == 5] or [" ".join(["A dog runs."] * 5)]
    singles = [en for p in paras for en, _ in p]

    def request(texts: list[str], split: bool) -> Any:
        async def send(conn: HTTPConnection, n: int) -> tuple[int, dict[str, float]]:
            body = {"text": texts[n % len(texts)], "split_sentences": split}
            response = await conn.request("POST", "/v1/translate", body, BYPASS_CACHE)
            count = response.json()["results"][0]["sentences"] if response.status == 200 else 0
            return response.status, {"sentences": float(count)}

        return send

    rounds: dict[str, list[LoadPoint]] = {"paragraph": [], "single": []}
    for _ in range(2):
        for name, texts in (("paragraph", fives), ("single", singles)):
            point = run_async(
                closed_loop(server, CLIENTS, request(texts, name == "paragraph"), duration_s=seconds)
            )
            rounds[name].append(point)
    return {name: merge_points(points) for name, points in rounds.items()}


def segmenters(paras: list[list[tuple[str, str]]]) -> list[str]:
    import sentencex

    try:
        import pysbd  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return ["pysbd is not installed here: the segmenter comparison (c) was skipped."]
    seg = pysbd.Segmenter(language="en", clean=False)
    ways = {"sentencex (served)": lambda t: list(sentencex.segment("en", t)), "pysbd 0.3.4": seg.segment}
    rows = ["| segmenter | paragraphs split exactly | ms per paragraph |", "|---|---|---|"]
    ended = [p for p in paras if all(en[-1] in ".!?" for en, _ in p)]
    for name, fn in ways.items():
        started = time.perf_counter()
        exact = sum(
            [s.strip() for s in fn(" ".join(en for en, _ in p)) if s.strip()] == [en for en, _ in p]
            for p in paras
        )
        ms = (time.perf_counter() - started) * 1e3 / len(paras)
        exact_ended = sum(
            [s.strip() for s in fn(" ".join(en for en, _ in p)) if s.strip()] == [en for en, _ in p]
            for p in ended
        )
        rows.append(
            f"| {name} | {exact}/{len(paras)} ({exact_ended}/{len(ended)} of those whose sentences all end in . ! ?) | {ms:.3f} |"
        )
    rows.append(
        "A paragraph whose sentence has no final punctuation (Multi30k has many) cannot be split there by "
        "either; both split every other paragraph exactly, so the faster, maintained one serves."
    )
    return rows


def run(opts: Options) -> Result:
    translator = find_model(opts.models, "translation")
    limit = opts.extra.get("paragraphs") or (20 if opts.quick else None)
    seconds = opts.extra.get("seconds") or (1.0 if opts.quick else 8.0)
    paras = paragraphs(pairs(), limit)
    env = {"MAX_ITEMS": "32", "CACHE_ENABLED": "false"}
    with subset_repository([translator]) as repo, benchmark_server(repo, opts, env) as server:
        provider = providers(server)
        found = bleu(server, paras)
        points = throughput(server, paras, seconds)
    gap = found["bleu_alone"] - found["bleu_split"]
    rate = {name: ratio(p.total("sentences"), p.seconds) for name, p in points.items()}
    speed = ratio(rate["paragraph"], rate["single"])
    metrics: dict[str, Any] = {
        **{k: v for k, v in found.items()},
        "bleu_gap_split_vs_alone": gap,
        "paragraph_over_single_sentences_per_s_8": speed,
        **{f"sentences_per_s_{name}": r for name, r in rate.items()},
    }
    details = [
        "### (a) BLEU on validation paragraphs of 3-5 sentences",
        "",
        "| path | requests | BLEU | wall s (8 clients) |",
        "|---|---|---|---|",
        f"| split and joined (served default) | {found['paragraphs']} paragraphs | {found['bleu_split']:.2f} | {found['split_s']:.1f} |",
        f"| one by one, joined with a space | {found['sentences']} sentences | {found['bleu_alone']:.2f} | {found['alone_s']:.1f} |",
        f"| whole paragraph, unsplit (before) | {found['paragraphs']} paragraphs | {found['bleu_whole']:.2f} | |",
        "",
        f"Gap (one by one - split): {gap:+.2f} BLEU. The segmenter split {found['exact_split']}/{found['paragraphs']} "
        f"paragraphs into exactly their sentences; {found['same_text']}/{found['paragraphs']} split translations are "
        f"identical to the one-by-one ones. Unsplit, {found['truncated_whole']} paragraphs were cut at max_source_length. "
        "sacrebleu corpus BLEU (13a), greedy search; the references are the German sentences joined with a space.",
        "",
        "### (b) Throughput at 8 clients: a 5-sentence paragraph per request vs one sentence per request",
        "",
        "| requests of | requests/s | sentences/s | p50 ms | p95 ms | non-200 | server cores |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in points.items():
        cores = ratio(p.server_cpu_s, p.seconds)
        details.append(
            f"| {name} | {p.rps:.1f} | {rate[name]:.1f} | {p.p(50) * 1e3:.0f} | {p.p(95) * 1e3:.0f} | {p.errors} | {cores:.2f} |"
        )
    details += [
        "",
        f"Closed loop, {CLIENTS} clients, two rounds of {seconds:g} s per kind taking turns. Paragraph/single "
        f"sentences per second: {speed:.2f}x.",
        "",
        "### (c) The segmenter",
        "",
        *segmenters(paras),
    ]
    checks = [
        Check(
            "BLEU gap, one by one - split (paragraphs)", gap, TARGET_BLEU_GAP, higher_is_better=False, unit=""
        ),
        Check("Paragraph vs single sentences/s, 8 clients", speed, 1.0),
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
