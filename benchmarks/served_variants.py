"""(i) Served int8 (fp16 on CUDA) vs fused fp32: classify, generate and translate requests/s at 32 clients.

Two real servers (``python -m service`` on free loopback ports) on the same models, one with
``MODEL_VARIANT=int8`` (per-row int8 matmuls, ``model_export/quantize_rows.py``), one with
``MODEL_VARIANT=fused`` (what the service served on CPU before int8 passed the batch rule), run side
by side and take turns workload by workload for a few rounds, so that drift on a shared machine hits
both alike. Closed-loop clients (``load.py``), ``Cache-Control: no-cache, no-store``:

- classify: one SST-2 validation sentence per request (``/v1/classify``);
- generate: greedy, 32 new tokens from a Tiny Shakespeare prompt (``/v1/generate``);
- translate: greedy, one Multi30k English sentence (``/v1/translate``).

Each side also reports which variant it really served (``/v1/models``): a model without an int8
variant serves its fallback, and the table says so. ``int8_served_classify_speedup_32`` is the
int8 server's classify requests/s over the fused server's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # `python benchmarks/served_variants.py` anywhere

from benchmarks.cli import main
from benchmarks.data import english_sentences, sentiment_texts, shakespeare_prompts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import ratio

NAME = "served_variants"
TITLE = "(i) Served int8 (fp16 on CUDA) vs fused fp32: classify, generate, translate at 32 clients"
# The reduced-precision variant against fused fp32, by device: int8 on CPU, fp16 on CUDA.
VARIANTS = {"cpu": ("int8", "fused"), "cuda": ("fp16", "fused")}
TASKS = {"classify": "text-classification", "generate": "text-generation", "translate": "translation"}
CLIENTS = 32
NEW_TOKENS = 32
TARGET_CLASSIFY = 1.8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per point (default 6, quick 0.5)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument(
        "--clients", type=int, default=CLIENTS, help=f"concurrent clients (default {CLIENTS})"
    )


def _post(path: str, bodies: list[dict[str, object]]) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        response = await conn.request("POST", path, bodies[i % len(bodies)], BYPASS_CACHE)
        return response.status, {}

    return request


def workloads() -> dict[str, RequestFn]:
    return {
        "classify": _post("/v1/classify", [{"text": t} for t in sentiment_texts()]),
        "generate": _post(
            "/v1/generate",
            [{"prompt": p, "max_new_tokens": NEW_TOKENS, "temperature": 0} for p in shakespeare_prompts(64)],
        ),
        "translate": _post("/v1/translate", [{"text": s, "beam_size": 1} for s in english_sentences()]),
    }


def served_variants(server: ServiceProcess) -> dict[str, str]:
    """model -> the variant it really serves, from /v1/models."""
    try:
        return {m["id"]: m.get("variant", "?") for m in server.get_json("/v1/models")["data"]}
    except (OSError, ValueError, KeyError):
        return {}


def run(opts: Options) -> Result:
    folders = {name: find_model(opts.models, task) for name, task in TASKS.items()}
    clients = int(opts.extra.get("clients") or CLIENTS)
    duration = opts.extra.get("duration") or (0.5 if opts.quick else 6.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    warmup = 0.2 if opts.quick else 1.0
    requests = workloads()
    low, base = variants = VARIANTS["cuda" if opts.device == "cuda" else "cpu"]
    found: dict[str, dict[str, list[LoadPoint]]] = {v: {w: [] for w in requests} for v in variants}
    with subset_repository(sorted(set(folders.values()))) as repo, contextlib.ExitStack() as stack:
        servers = {
            v: stack.enter_context(benchmark_server(repo, opts, env={"MODEL_VARIANT": v})) for v in variants
        }
        provider = providers(servers[base])
        serving = {v: served_variants(s) for v, s in servers.items()}
        for _ in range(rounds):
            for workload, request in requests.items():
                for variant, server in servers.items():
                    point = closed_loop(server, clients, request, duration_s=duration, warmup_s=warmup)
                    found[variant][workload].append(run_async(point))
    points = {v: {w: merge_points(ps) for w, ps in by_w.items()} for v, by_w in found.items()}

    metrics: dict[str, object] = {"clients": clients, "duration_s": duration, "rounds": rounds}
    rows = [
        f"| workload ({clients} clients) | model ({low} side serves) | {low}: req/s | p50 ms | p99 ms | "
        f"fused: req/s | p50 ms | p99 ms | {low} / fused | server cores ({low} / fused) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload in requests:
        q, f = points[low][workload], points[base][workload]
        model = folders[workload].name
        speedup = ratio(q.rps, f.rps)
        metrics[f"{low}_served_{workload}_speedup_{clients}"] = speedup
        metrics[f"rps_{low}_{workload}"], metrics[f"rps_fused_{workload}"] = q.rps, f.rps
        for side, measured in ((low, q), (base, f)):
            metrics[f"p50_ms_{side}_{workload}"] = measured.p(50) * 1e3
            metrics[f"p99_ms_{side}_{workload}"] = measured.p(99) * 1e3
        metrics[f"errors_{workload}"] = q.errors + f.errors
        rows.append(
            f"| {workload} | {model} ({serving[low].get(model, '?')}) | {q.rps:.1f} | {q.p(50) * 1e3:.0f} | "
            f"{q.p(99) * 1e3:.0f} | {f.rps:.1f} | {f.p(50) * 1e3:.0f} | {f.p(99) * 1e3:.0f} | "
            f"{speedup:.2f}x | {cores_used(q.server_cpu_s, q.seconds)} / {cores_used(f.server_cpu_s, f.seconds)} |"
        )
    errors = sum(p.errors for by_w in points.values() for p in by_w.values())
    details = [
        *rows,
        "",
        f"Two servers on the same models, `MODEL_VARIANT={low}` and `MODEL_VARIANT=fused`, taking turns "
        f"workload by workload; {rounds} round(s) of {duration:g} s per point after {warmup:g} s of warm-up; "
        f"closed loop, one keep-alive connection per client, `Cache-Control: no-cache, no-store`. generate: "
        f"greedy, {NEW_TOKENS} new tokens; translate: greedy (beam_size 1). Non-200 answers: {errors}.",
    ]
    classify = metrics[f"{low}_served_classify_speedup_{clients}"]
    checks = [
        Check(
            f"{low} / fused served classify throughput, {clients} clients",
            float(classify),  # type: ignore[arg-type]
            TARGET_CLASSIFY,
        )
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
