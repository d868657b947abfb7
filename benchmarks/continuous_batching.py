"""(d) Continuous batching: aggregate generated tokens/s at 1/4/16/32 concurrent streams, and TTFT.

The real service with only the GPT model loaded; each client streams (``stream: true``, Server-Sent
Events) greedy completions of ``max_new_tokens`` tokens from Tiny Shakespeare prompts, one after the
other, for a fixed duration per point. Tokens/s counts the ``token`` events of the requests started
in the window; time to first token is request sent -> first ``token`` event, under that load.
MAX_RUNNING_SEQUENCES stays at the service default (16) unless ``--max-running-sequences`` says
otherwise (the GPU table raises it to 64): at 32 streams half of them wait for a slot, which shows
in their TTFT.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/continuous_batching.py`

from benchmarks.cli import main
from benchmarks.data import shakespeare_prompts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.sse import sse_events
from harness.stats import percentile, ratio

NAME = "continuous_batching"
TITLE = "(d) Continuous batching: aggregate generated tokens/s with N concurrent streams vs 1"
STREAMS = (1, 4, 16, 32)
TARGET_16 = 6.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="seconds per point (default 5, quick 1)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per request (default 64, quick 16)")
    parser.add_argument("--streams", type=int, nargs="+", default=None, help=f"default {STREAMS}")
    parser.add_argument(
        "--max-running-sequences",
        type=int,
        default=None,
        help="the server's MAX_RUNNING_SEQUENCES (default 16)",
    )


def stream_request(prompts: list[str], max_new_tokens: int) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        body = {
            "prompt": prompts[i % len(prompts)],
            "max_new_tokens": max_new_tokens,
            "temperature": 0,
            "stream": True,
        }
        t0 = time.perf_counter()
        ttft, tokens, status, finished = float("nan"), 0, 0, False
        async for code, event, _ in sse_events(conn.stream("/v1/generate", body, BYPASS_CACHE)):
            status = code
            if event == "token":
                if tokens == 0:
                    ttft = time.perf_counter() - t0
                tokens += 1
            elif event == "done":
                finished = True
        if status == 200 and not finished:
            status = 599  # the stream ended with an error event or without its done event
        return status, {"ttft": ttft, "tokens": float(tokens)}

    return request


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-generation")
    streams = opts.extra.get("streams") or ([1, 16] if opts.quick else list(STREAMS))
    streams = sorted({*streams, 1, 16})
    duration = opts.extra.get("duration") or (1.0 if opts.quick else 5.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 2)
    max_new = opts.extra.get("max_new_tokens") or (16 if opts.quick else 64)
    warmup = 0.3 if opts.quick else 1.0
    max_running = int(opts.extra.get("max_running_sequences") or 16)  # 16: the service's default
    prompts = shakespeare_prompts(64)
    runs: dict[int, list[LoadPoint]] = {n: [] for n in streams}
    env = {"MAX_RUNNING_SEQUENCES": str(max_running)}
    with subset_repository([folder]) as repo, benchmark_server(repo, opts, env=env) as server:
        provider = providers(server)
        request = stream_request(prompts, max_new)
        for _ in range(rounds):  # the points take turns, so that drift on a shared machine hits all alike
            for n in streams:
                runs[n].append(
                    run_async(closed_loop(server, n, request, duration_s=duration, warmup_s=warmup))
                )
    points = {n: merge_points(ps) for n, ps in runs.items()}

    def tps(p: LoadPoint) -> float:
        return ratio(p.total("tokens"), p.seconds)

    base = tps(points[1])
    metrics: dict[str, object] = {
        "model": folder.name,
        "max_new_tokens": max_new,
        "duration_s": duration,
        "max_running_sequences": max_running,
    }
    rows = [
        "| streams | tokens/s | vs 1 stream | per stream tok/s | TTFT p50 ms | TTFT p95 ms | requests | "
        "server cores | client cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, p in points.items():
        ttft = [t for t in p.extra.get("ttft", []) if t == t]
        speedup = ratio(tps(p), base)
        metrics[f"continuous_batching_speedup_{n}"] = speedup
        metrics[f"tokens_per_s_{n}"] = tps(p)
        metrics[f"ttft_p50_ms_{n}"] = percentile(ttft, 50) * 1e3
        metrics[f"ttft_p95_ms_{n}"] = percentile(ttft, 95) * 1e3
        metrics[f"errors_{n}"] = p.errors
        rows.append(
            f"| {n} | {tps(p):.1f} | {speedup:.2f}x | {tps(p) / n:.1f} | {percentile(ttft, 50) * 1e3:.1f} | "
            f"{percentile(ttft, 95) * 1e3:.1f} | {p.requests} | {cores_used(p.server_cpu_s, p.seconds)} | "
            f"{cores_used(p.client_cpu_s, p.seconds)} |"
        )
    errors = sum(p.errors for p in points.values())
    details = [
        *rows,
        "",
        f"Model `{folder.name}`; greedy, max_new_tokens={max_new}, streamed (SSE); {rounds} round(s) of "
        f"{duration:g} s per point (after {warmup:g} s of warm-up each), points taking turns; closed loop, one connection per stream; "
        f"MAX_RUNNING_SEQUENCES={max_running}{' (the service default)' if max_running == 16 else ''}. Failed or incomplete streams: {errors}.",
    ]
    checks = [
        Check(
            "Continuous batching, 16 streams vs 1 (tokens/s)",
            float(metrics["continuous_batching_speedup_16"]),  # type: ignore[arg-type]
            TARGET_16,
        )
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
