"""(b) Served text-classification throughput with dynamic batching (MAX_BATCH_SIZE=32) vs MAX_BATCH_SIZE=1.

Two real servers (``python -m service`` on free loopback ports, only the text classifier loaded)
run side by side and take turns, point by point, for two rounds: closed-loop asyncio clients at
1/8/32/64 concurrent clients for a fixed duration per point. Each request classifies one SST-2 validation sentence and
sends ``Cache-Control: no-cache, no-store`` so that a response cache never answers. Client and server share
the machine's cores: the table gives the CPU each side used (cores busy over the window).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/batching.py` anywhere

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import ratio

NAME = "batching"
TITLE = "(b) Dynamic batching: served classify throughput, MAX_BATCH_SIZE=32 vs 1"
CONCURRENCY = (1, 8, 32, 64)
BATCH_SIZES = (32, 1)
TARGET_32 = 4.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per point (default 4, quick 0.5)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    parser.add_argument("--workers", type=int, default=None, help="the servers' WORKERS (default 1)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=None, help=f"clients per point (default {CONCURRENCY})"
    )


def classify_request(texts: list[str]) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        response = await conn.request("POST", "/v1/classify", {"text": texts[i % len(texts)]}, BYPASS_CACHE)
        return response.status, {}

    return request


def measure(
    server: ServiceProcess, texts: list[str], concurrency: list[int], duration: float, warmup: float
) -> dict[int, LoadPoint]:
    request = classify_request(texts)
    return {
        c: run_async(closed_loop(server, c, request, duration_s=duration, warmup_s=warmup))
        for c in concurrency
    }


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-classification")
    concurrency = opts.extra.get("concurrency") or ([1, 32] if opts.quick else list(CONCURRENCY))
    if 32 not in concurrency:
        concurrency = sorted({*concurrency, 32})
    duration = opts.extra.get("duration") or (0.5 if opts.quick else 4.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 2)
    warmup = 0.2 if opts.quick else 1.0
    workers = int(opts.extra.get("workers") or 1)  # uvicorn worker processes, each with its own models
    texts = sentiment_texts()
    runs: dict[int, dict[int, list[LoadPoint]]] = {b: {c: [] for c in concurrency} for b in BATCH_SIZES}
    with subset_repository([folder]) as repo, contextlib.ExitStack() as stack:
        # Both servers run side by side (an idle one costs nothing) and take turns, point by point, so
        # that drift on a shared machine hits both alike.
        servers = {
            b: stack.enter_context(
                benchmark_server(
                    repo,
                    opts,
                    env={"MAX_BATCH_SIZE": str(b), "WORKERS": str(workers)},
                    cpu_of_tree=workers > 1,  # the workers are the parent's children
                )
            )
            for b in BATCH_SIZES
        }
        provider = providers(servers[32])
        for _ in range(rounds):
            for c in concurrency:
                for b, server in servers.items():
                    runs[b][c] += measure(server, texts, [c], duration, warmup).values()
    points = {b: {c: merge_points(ps) for c, ps in by_c.items()} for b, by_c in runs.items()}

    rows = [
        "| clients | batch 32: req/s | p50 ms | p95 ms | batch 1: req/s | p50 ms | p95 ms | speedup | "
        "server cores (32 / 1) | client cores (32 / 1) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    metrics: dict[str, object] = {
        "model": folder.name,
        "duration_s": duration,
        "texts": len(texts),
        "workers": workers,
    }
    for c in concurrency:
        big, one = points[32][c], points[1][c]
        speedup = ratio(big.rps, one.rps)
        metrics[f"batching_speedup_{c}"] = speedup
        metrics[f"rps_batch32_c{c}"] = big.rps
        metrics[f"rps_batch1_c{c}"] = one.rps
        metrics[f"errors_c{c}"] = big.errors + one.errors
        rows.append(
            f"| {c} | {big.rps:.1f} | {big.p(50) * 1e3:.1f} | {big.p(95) * 1e3:.1f} | {one.rps:.1f} | "
            f"{one.p(50) * 1e3:.1f} | {one.p(95) * 1e3:.1f} | {speedup:.2f}x | "
            f"{cores_used(big.server_cpu_s, big.seconds)} / {cores_used(one.server_cpu_s, one.seconds)} | "
            f"{cores_used(big.client_cpu_s, big.seconds)} / {cores_used(one.client_cpu_s, one.seconds)} |"
        )
    errors = sum(p.errors for by_c in points.values() for p in by_c.values())
    details = [
        *rows,
        "",
        f"Model `{folder.name}`, WORKERS={workers}, one SST-2 validation sentence per request ({len(texts)} in rotation), "
        f"`Cache-Control: no-cache, no-store`; {rounds} round(s) of {duration:g} s per point (after {warmup:g} s "
        "of warm-up each), the two servers taking turns point by point; closed loop "
        f"(asyncio + uvloop, a minimal keep-alive HTTP/1.1 client, one connection per client). Non-200 answers: {errors}. Server and client share the machine: "
        "'cores' is CPU time over wall time of each process during the point.",
    ]
    label = "Batching speedup, 32 clients" + (f", {workers} workers" if workers > 1 else "")
    checks = [Check(label, float(metrics["batching_speedup_32"]), TARGET_32)]  # type: ignore[arg-type]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
