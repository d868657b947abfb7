"""(w) Classify, generate and translate at 32, 64 and 256 connections, driven by wrk.

One server with the classifier, GPT and the translator (the response cache off, so every request
reaches a model); each task answers one request first (its body checked), then wrk drives it at each
connection count in turn for ``--duration`` seconds after a warm-up: requests/s, p50 and p99 latency,
errors. wrk (a C load generator, Debian's ``wrk``; the GPU run carries its .deb) keeps the client's
cost far below the server's, which a Python client at 256 connections would not. On the GPU table the
service serves the fp16 graphs on CUDA, its KV cache on the device.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/wrk_sweep.py` anywhere

import httpx

from benchmarks.cli import main
from benchmarks.data import sentiment_texts, shakespeare_prompts
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.request_path import _WRK_SCRIPT, Load, _run_client, wrk_load
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.service_process import ServiceProcess

NAME = "wrk_sweep"
TITLE = "(w) Classify, generate and translate at 32, 64 and 256 connections (wrk)"
CONNECTIONS = (32, 64, 256)
TASKS = {  # task -> (model task in the manifest, path, body)
    "classify": ("text-classification", "/v1/classify"),
    "generate": ("text-generation", "/v1/generate"),
    "translate": ("translation", "/v1/translate"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="seconds per point (default 5, quick 1)")
    parser.add_argument("--connections", type=int, nargs="+", default=None, help=f"default {CONNECTIONS}")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=None, help="default: all three")
    parser.add_argument("--wrk-threads", type=int, default=None, help="wrk's threads (default: 4, quick 1)")


def bodies() -> dict[str, dict[str, object]]:
    """One request body per task: a validation sentence, a Shakespeare prompt (32 greedy tokens), a sentence."""
    return {
        "classify": {"text": sentiment_texts()[0]},
        "generate": {"prompt": shakespeare_prompts(1)[0], "max_new_tokens": 32, "temperature": 0},
        "translate": {"text": "A man in a blue shirt is standing on a ladder.", "beam_size": 1},
    }


def wrk_binary() -> str | None:
    """wrk on PATH, or where the GPU run unpacked its .deb (``WRK``)."""
    return os.environ.get("WRK") or shutil.which("wrk")


def wrk_post(
    url: str, body: bytes, seconds: float, connections: int, threads: int, work: Path, headers: dict[str, str]
) -> Load:
    """wrk POSTing ``body`` to ``url`` with ``connections`` open connections for ``seconds``."""
    binary = wrk_binary()
    if binary is None:
        raise RuntimeError("wrk is not installed (Debian's wrk; scripts/gpu/pack.py carries its .deb)")
    (work / "body").write_bytes(body)
    script = work / "post.lua"
    script.write_text(_WRK_SCRIPT)
    env = {"BODY_FILE": str(work / "body"), "BODY_HEADERS": "\n".join(f"{k}:{v}" for k, v in headers.items())}
    command = [binary, f"-t{min(threads, connections)}", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    return wrk_load(*_run_client([*command, "-s", str(script), url], env))


def skip_reason(opts: Options) -> str | None:
    return None if wrk_binary() is not None else "wrk is not installed (./scripts/setup.sh --test-tools)"


def sweep(
    server: ServiceProcess,
    requests: dict[str, tuple[str, bytes, dict[str, str]]],
    connections: list[int],
    seconds: float,
    threads: int,
    metrics: dict[str, object],
    prefix: str = "",
) -> list[str]:
    """Each request at each connection count, after a one-second warm-up; the table's rows."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for task, (path, body, headers) in requests.items():
            wrk_post(server.url + path, body, min(1.0, seconds), max(connections), threads, work, headers)
            for c in connections:
                before = server.cpu_seconds()
                load = wrk_post(server.url + path, body, seconds, c, threads, work, headers)
                cpu = server.cpu_seconds() - before
                rps = load.requests / load.seconds if load.seconds else 0.0
                key = f"{prefix}{task}_c{c}"
                metrics[f"{key}_rps"], metrics[f"{key}_p50_ms"], metrics[f"{key}_p99_ms"] = (
                    rps,
                    load.p50_ms,
                    load.p99_ms,
                )
                metrics[f"{key}_errors"] = load.errors
                rows.append(
                    f"| {task} | {c} | {rps:.1f} | {load.p50_ms:.1f} | {load.p99_ms:.1f} | {load.errors} | "
                    f"{cores_used(cpu, load.seconds)} | {cores_used(load.client_cpu_s, load.seconds)} |"
                )
    return rows


def run(opts: Options) -> Result:
    chosen = opts.extra.get("tasks") or list(TASKS)
    connections = opts.extra.get("connections") or ([8, 32] if opts.quick else list(CONNECTIONS))
    seconds = opts.extra.get("duration") or (1.0 if opts.quick else 5.0)
    threads = opts.extra.get("wrk_threads") or (1 if opts.quick else 4)
    folders = {task: find_model(opts.models, TASKS[task][0]) for task in chosen}
    metrics: dict[str, object] = {"duration_s": seconds, "wrk_threads": threads}
    env = {"CACHE_ENABLED": "false", "ACCESS_LOG": "false"}
    json_headers = {"Content-Type": "application/json"}
    every = bodies()
    with subset_repository(list(folders.values())) as repo, benchmark_server(repo, opts, env=env) as server:
        provider = providers(server)
        requests = {}
        for task in chosen:
            path = TASKS[task][1]
            answer = httpx.post(server.url + path, json=every[task], timeout=120)
            if answer.status_code != 200:
                raise RuntimeError(f"{path} answered {answer.status_code}: {answer.text[:300]}")
            requests[task] = (path, json.dumps(every[task]).encode(), json_headers)
        rows = sweep(server, requests, connections, seconds, threads, metrics)
    errors = sum(int(v) for k, v in metrics.items() if k.endswith("_errors"))  # type: ignore[call-overload]
    details = [
        "| task | connections | requests/s | p50 ms | p99 ms | errors | server cores | wrk cores |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Models {', '.join(f'`{f.name}`' for f in folders.values())} in one server (response cache off); wrk, "
        f"{threads} thread(s), {seconds:g} s per point after a 1 s warm-up at the most connections; one body "
        "per task (generate: 32 greedy tokens; translate: greedy). Errors (connect, read, timeout, non-2xx): "
        f"{errors}.",
    ]
    return Result(
        NAME,
        TITLE,
        metrics,
        [Check("wrk errors", float(errors), 0.0, False)],
        details,
        {"provider": provider},
    )


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
