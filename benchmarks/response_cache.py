"""(e) Response cache: latency of a cache hit vs a miss, for generate (greedy) and translate (beam search).

The real service with the GPT and translator models (the in-process LRU is the default cache). A
miss is the request sent with ``Cache-Control: no-cache`` (the lookup is bypassed, the model runs);
a hit is the same request without that header once it has been answered, and must say
``"cached": true``. Requests go one at a time, so each latency is one request alone. If ``cached``
never turns true, the cache is not there (or is off): the ratio is then repeat / miss latency
(about 1) and the result says so instead of failing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/response_cache.py` anywhere

from benchmarks.cli import main
from benchmarks.load import MISS
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import median, percentile, ratio

NAME = "response_cache"
TITLE = "(e) Response cache: hit vs miss latency (generate, translate)"
TARGET_GENERATE = 20.0

GENERATE = {"prompt": "ROMEO:\nWhat light through yonder", "max_new_tokens": 64, "temperature": 0}
TRANSLATE = {"text": "A man in a blue shirt is riding a bicycle down the street.", "beam_size": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--misses", type=int, default=None, help="timed misses per endpoint (default 10, quick 2)"
    )
    parser.add_argument(
        "--hits", type=int, default=None, help="timed hits per endpoint (default 50, quick 5)"
    )


async def measure(
    server: ServiceProcess, path: str, body: dict[str, Any], misses: int, hits: int
) -> dict[str, Any]:
    conn = HTTPConnection("127.0.0.1", server.port)
    try:
        output_tokens = 0

        async def send(headers: dict[str, str] | None) -> tuple[float, bool]:
            nonlocal output_tokens
            t0 = time.perf_counter()
            response = await conn.request("POST", path, body, headers)
            elapsed = time.perf_counter() - t0
            if response.status != 200:
                raise RuntimeError(f"{path} answered {response.status}: {response.body[:300]!r}")
            answer = response.json()
            output_tokens = int(answer.get("usage", {}).get("output_tokens", 0))
            return elapsed, bool(answer.get("cached"))

        await send(MISS)  # warm-up, not timed
        miss = []
        miss_said_cached = 0
        for _ in range(misses):
            seconds, cached = await send(MISS)
            miss.append(seconds)
            miss_said_cached += cached
        await send(None)  # stores the answer (a cache may already hold it)
        hit, hit_cached = [], 0
        for _ in range(hits):
            seconds, cached = await send(None)
            hit.append(seconds)
            hit_cached += cached
    finally:
        await conn.close()
    return {
        "output_tokens": output_tokens,
        "miss": miss,
        "hit": hit,
        "hits_cached": hit_cached,
        "misses_cached": miss_said_cached,
        "active": hit_cached > 0,
    }


def run(opts: Options) -> Result:
    gpt = find_model(opts.models, "text-generation")
    translator = find_model(opts.models, "translation")
    misses = opts.extra.get("misses") or (2 if opts.quick else 10)
    hits = opts.extra.get("hits") or (5 if opts.quick else 50)
    generate = {**GENERATE, "max_new_tokens": 16 if opts.quick else 64}
    with subset_repository([gpt, translator]) as repo, benchmark_server(repo, opts) as server:
        provider = providers(server)
        found = {
            "generate": run_async(measure(server, "/v1/generate", generate, misses, hits)),
            "translate": run_async(measure(server, "/v1/translate", TRANSLATE, misses, hits)),
        }

    metrics: dict[str, object] = {}
    rows = [
        "| endpoint | request | output tokens | miss p50 ms | miss p95 ms | hit p50 ms | hit p95 ms | speedup | "
        "hits saying cached |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    described = {
        "generate": f"greedy, max_new_tokens={generate['max_new_tokens']}",
        "translate": "beam_size=4, one sentence",
    }
    for name, f in found.items():
        speedup = ratio(median(f["miss"]), median(f["hit"]))
        metrics[f"cache_hit_speedup_{name}"] = speedup
        metrics[f"cache_miss_p50_ms_{name}"] = median(f["miss"]) * 1e3
        metrics[f"cache_hit_p50_ms_{name}"] = median(f["hit"]) * 1e3
        metrics[f"cache_active_{name}"] = f["active"]
        rows.append(
            f"| {name} | {described[name]} | {f['output_tokens']} | {median(f['miss']) * 1e3:.1f} | {percentile(f['miss'], 95) * 1e3:.1f} | "
            f"{median(f['hit']) * 1e3:.2f} | {percentile(f['hit'], 95) * 1e3:.2f} | {speedup:.1f}x | "
            f"{f['hits_cached']}/{len(f['hit'])} |"
        )
    active = all(f["active"] for f in found.values())
    metrics["cache_active"] = active
    details = [*rows, ""]
    if not active:
        off = [n for n, f in found.items() if not f["active"]]
        details.append(
            f"**The response cache did not answer** ({', '.join(off)}): no repeated request came back with "
            '`"cached": true`, so the cache is not in this build (or is turned off). The speedups above are '
            "then repeat / miss latency, not hit / miss."
        )
    bypassed = {n: f["misses_cached"] for n, f in found.items() if f["misses_cached"]}
    if bypassed:
        details.append(
            f"**`Cache-Control: no-cache` was not honoured**: misses answered as cached: {bypassed}."
        )
    details.append(
        f"One request at a time on one keep-alive connection; {misses} misses (`Cache-Control: no-cache`) and "
        f"{hits} hits per endpoint, after one untimed warm-up and one request that stores the answer."
    )
    label = "Cache hit vs miss, generate" + ("" if found["generate"]["active"] else " (cache NOT active)")
    checks = [Check(label, float(metrics["cache_hit_speedup_generate"]), TARGET_GENERATE)]  # type: ignore[arg-type]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
