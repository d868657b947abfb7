"""(u) Thrash: clients alternating between two models under a memory budget that holds one of them.

One real server (``python -m service``) serves the text classifier and the entity tagger with
``MODEL_MEMORY_BUDGET`` at the larger one's resident size as a process measures it plus three quarters
of the smaller's (so either fits, never both). Two closed-loop clients alternate between the two models in opposite orders, each request
naming its model, for the same time against two servers that differ in one setting only:
``MODEL_MIN_RESIDENCY_S=0`` (no bound: a model may be unloaded the moment it is idle, which is how the
service behaved before the bound) and the default (2 s: a model loaded on demand serves at least that
long before it may go). Reported for each: answers by status, loads per second (the growth of
``tserve_model_loads_total``), the server's CPU per answered request (``/proc``), and latency.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/thrash.py` anywhere

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server
from harness.stats import percentile

NAME = "thrash"
TITLE = "(u) Thrash: two clients alternating between two models, a budget for one"
BODIES = {
    "text-classification": ("/v1/classify", {"text": "a fine film"}),
    "token-classification": ("/v1/extract", {"task": "entities", "text": "Ada lived in London."}),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=None, help="per server (default 30, quick 4)")


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _sizes(opts: Options, names: list[str]) -> dict[str, float]:
    env = {"SERVED_MODELS": ",".join(names), "MODEL_MEMORY_BUDGET": str(10**12), "CACHE_ENABLED": "false"}
    with benchmark_server(opts.models, opts, env) as probe:
        return {n: _metric(probe.url, "tserve_model_resident_bytes", model=n) for n in names}


def _alternate(
    opts: Options, tasks: dict[str, str], budget: int, residency: float, seconds: float
) -> dict[str, Any]:
    """Two clients alternating between the models of ``tasks`` (name -> task) for ``seconds``."""
    names = list(tasks)
    env = {
        "SERVED_MODELS": ",".join(names),
        "MODEL_MEMORY_BUDGET": str(budget),
        "MODEL_MIN_RESIDENCY_S": str(residency),
        "CACHE_ENABLED": "false",
        "ACCESS_LOG": "false",
    }
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    lock = threading.Lock()
    with benchmark_server(opts.models, opts, env) as server:
        loads_before = _metric(server.url, "tserve_model_loads_total", result="loaded")
        cpu_before = server.cpu_seconds()
        stop_at = time.monotonic() + seconds

        def client(order: list[str]) -> None:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                turn = 0
                while time.monotonic() < stop_at:
                    name = order[turn % len(order)]
                    turn += 1
                    path, body = BODIES[tasks[name]]
                    began = time.perf_counter()
                    status = http.post(path, json={**body, "model": name}).status_code
                    with lock:
                        statuses[status] = statuses.get(status, 0) + 1
                        latencies.append(time.perf_counter() - began)

        began = time.monotonic()
        threads = [threading.Thread(target=client, args=(o,)) for o in (names, names[::-1])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        loads = _metric(server.url, "tserve_model_loads_total", result="loaded") - loads_before
        cpu = server.cpu_seconds() - cpu_before
    answered = statuses.get(200, 0)
    return {
        "residency_s": residency,
        "seconds": elapsed,
        "statuses": statuses,
        "answered": answered,
        "loads": loads,
        "loads_per_s": loads / elapsed,
        "cpu_ms_per_answer": 1000 * cpu / answered if answered else float("nan"),
        "server_cores": cpu / elapsed,
        "answers_per_s": answered / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


def run(opts: Options) -> Result:
    tasks = {find_model(opts.models, task).name: task for task in BODIES}
    names = list(tasks)
    seconds = opts.extra.get("seconds") or (4.0 if opts.quick else 30.0)
    sizes = _sizes(opts, names)
    # the first model a process loads also carries ONNX Runtime's one-time start, and keeps that figure:
    # the larger plus three quarters of the smaller holds either alone, never both
    budget = int(max(sizes.values()) + 0.75 * min(sizes.values()))
    unbounded = _alternate(opts, tasks, budget, 0.0, seconds)
    bounded = _alternate(opts, tasks, budget, 2.0, seconds)
    rows = [
        "| MODEL_MIN_RESIDENCY_S | answers (status: count) | answers/s | loads/s | server CPU (cores) | "
        "CPU ms per answer | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in (unbounded, bounded):
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        rows.append(
            f"| {r['residency_s']:g} | {counts} | {r['answers_per_s']:.1f} | {r['loads_per_s']:.2f} | "
            f"{r['server_cores']:.2f} | {r['cpu_ms_per_answer']:.1f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} |"
        )
    cut = unbounded["server_cores"] / bounded["server_cores"]
    details = [
        *rows,
        "",
        f"{names[0]} and {names[1]}, budget {budget / 2**20:.1f} MiB (the larger's measured "
        f"{max(sizes.values()) / 2**20:.1f} MiB and three quarters of the smaller's {min(sizes.values()) / 2**20:.1f}), "
        "two closed-loop clients alternating in opposite orders, "
        f"{seconds:g} s per server. The bound cuts the CPU the server spends {cut:.1f}x: the clients, not the "
        "server, pay for their alternation (each switch waits for the other model's residency).",
    ]
    metrics = {"names": names, "budget_bytes": budget, "unbounded": unbounded, "bounded": bounded}
    checks = [
        Check(
            "Loads per second with the bound (at most 1 / residency)",
            bounded["loads_per_s"],
            0.5,
            False,
            " /s",
        ),
        Check("Server CPU, unbounded over bounded", cut, 2.0),
    ]
    return Result(NAME, TITLE, metrics, checks, details)


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
