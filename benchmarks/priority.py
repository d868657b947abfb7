"""(o) Request priorities under overload: high-priority latency at 2x and 10x capacity against an idle service.

One real server (``python -m service``, only the text classifier loaded, ``MAX_QUEUE_SIZE`` 64 so that
the queue fills and more urgent work displaces less urgent; the service's other defaults). Every request
classifies one SST-2 sentence on ``/v1/classify`` with ``Cache-Control: no-cache, no-store``, its class in
``X-Request-Priority`` (as a gateway would set it; what the edge sheds by, SHED_LAG_MS) or, with
``--priority-in body``, in the body's ``priority`` (read too late to shed by: it orders the queue only).

1. Capacity: 32 closed-loop clients, default (normal) priority: C requests/s.
2. Idle: one closed-loop client sending ``priority: high`` to an otherwise idle service: p50/p99.
3. Overload: an open loop of Poisson arrivals at 10x C (a fixed seed, so a bounded, repeatable total),
   every tenth arrival ``priority: high``, the others ``priority: low`` with ``timeout_ms`` 2000 (a
   client that stops caring after 2 s: 504 when it passes while queued; below PRIORITY_AGING_S, so a
   low item never rises a class). Each arrival is sent at its time on an idle keep-alive connection of
   its class's pool (256 for high, as a client of its own would have, 512 for low; together below the
   service's MAX_IN_FLIGHT_REQUESTS of 1024, whose 503 would otherwise answer), opened before the window;
   latency counts from the scheduled arrival, so a late client is never hidden. An arrival that finds
   every connection of its pool waiting is not sent, counted by class, as a proxy with a connection
   limit sheds it: the table gives the rate sent beside the one scheduled. After the window every
   answer is awaited, then the queue is let empty.

The same overload at 2x C (``--overload-2``) is measured beside it: the load a service meets on a bad
day rather than under attack, where a request's priority should matter most.

Idle and overload windows take turns (the order swapped every round) on the same server. Per class: the
200s' p50/p99 and the count of 200, 429, 504 and any other answer (0: no answer at all). The server's own
figures over the overload windows (``tserve_priority_*``, batches) say where the time went: waiting in the
model's queue, or before it (HTTP, JSON, tokenising on the one event loop, which also refuses every 429).

Headline: high-priority p99 under overload over its p99 idle (at most 2 at 10x; at most 3 at 2x, the
figure ``run_all.py`` carries as ``priority_high_p99_2x_over_idle``). Checks: low priority still gets
answers (200s) under overload, and no answer but 200, 429 and 504 in any window.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/priority.py` anywhere

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.model_loads import profiles
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import percentile, ratio
from service.engine.scheduling import PRIORITY_AGING_S
from service.settings import Settings

NAME = "priority"
TITLE = "(o) Request priorities: high-priority p99 at 2x and 10x overload vs idle, displacement, deadlines"
TARGET_HIGH_P99 = 2.0  # high-priority p99 under overload over idle, at most
TARGET_HIGH_P99_2X = 3.0  # the same at 2x overload, at most
OVERLOAD = 10.0  # arrival rate over the measured capacity
OVERLOAD_2 = 2.0  # the second overload, measured beside the first
HIGH_SHARE = 0.1  # of the overload's arrivals; the rest are low
PRIORITY_IN = "header"  # X-Request-Priority, as a gateway sets it, and the edge can shed by; or "body"
LOW_TIMEOUT_MS = 2000
QUEUE_SIZE = 64
CAPACITY_CLIENTS = 32
IDLE_CLIENTS = 1
# The open loop's connections per class: together below the service's MAX_IN_FLIGHT_REQUESTS (1024), whose
# 503 would otherwise answer. The high class has a pool of its own, as a client of its own would.
CONNECTIONS = {"high": 256, "low": 512}
SEED = 20261127
CLASSES = ("high", "low")
WINDOWS = ("idle", "overload", "overload 2")
# A client's patience: far beyond QUEUE_TIMEOUT_S, so that the service always answers first.
ANSWER_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per idle and overload window (default 4, quick 1)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="idle/overload turns (default 3, quick 1)")
    parser.add_argument(
        "--overload", type=float, default=OVERLOAD, help=f"arrival rate over capacity (default {OVERLOAD:g})"
    )
    parser.add_argument(
        "--overload-2",
        type=float,
        default=OVERLOAD_2,
        help=f"the second overload measured beside it, over capacity (default {OVERLOAD_2:g}; 0: none)",
    )
    parser.add_argument(
        "--high-share",
        type=float,
        default=HIGH_SHARE,
        help=f"share of the overload's arrivals sent high, the rest low (default {HIGH_SHARE:g})",
    )
    parser.add_argument(
        "--low-timeout-ms",
        type=int,
        default=LOW_TIMEOUT_MS,
        help=f"each low request's timeout_ms (default {LOW_TIMEOUT_MS}; 0: none)",
    )
    parser.add_argument(
        "--priority-in",
        choices=("header", "body"),
        default=PRIORITY_IN,
        help="where each request says its class: X-Request-Priority (what the edge sheds by before the "
        f"body is parsed) or the body's priority field (default {PRIORITY_IN})",
    )
    parser.add_argument(
        "--queue-size",
        type=int,
        default=QUEUE_SIZE,
        help=f"the server's MAX_QUEUE_SIZE (default {QUEUE_SIZE})",
    )
    parser.add_argument(
        "--capacity-clients",
        type=int,
        default=CAPACITY_CLIENTS,
        help=f"closed-loop clients measuring capacity (default {CAPACITY_CLIENTS})",
    )
    parser.add_argument(
        "--idle-clients",
        type=int,
        default=IDLE_CLIENTS,
        help=f"closed-loop clients of the idle baseline (default {IDLE_CLIENTS})",
    )
    parser.add_argument(
        "--low-connections",
        type=int,
        default=CONNECTIONS["low"],
        help=f"the open loop's connections for low requests: at most this many wait (default {CONNECTIONS['low']})",
    )
    parser.add_argument(
        "--high-connections",
        type=int,
        default=CONNECTIONS["high"],
        help=f"the open loop's connections for high requests (default {CONNECTIONS['high']})",
    )


# --- the requests ------------------------------------------------------------------------------


def classify_body(text: str, priority: str | None, timeout_ms: int = 0, in_body: bool = True) -> bytes:
    """A ``/v1/classify`` body, encoded once: the open loop sends thousands a second."""
    body: dict[str, Any] = {"text": text}
    if priority is not None and in_body:
        body["priority"] = priority
    if timeout_ms:
        body["timeout_ms"] = timeout_ms
    return json.dumps(body).encode()


def class_headers(priority: str | None, in_header: bool) -> dict[str, str]:
    """The request's headers: the cache bypassed, and the class in ``X-Request-Priority`` if sent there."""
    if priority is None or not in_header:
        return BYPASS_CACHE
    return {**BYPASS_CACHE, "X-Request-Priority": priority}


def classify_request(bodies: list[bytes], headers: dict[str, str] = BYPASS_CACHE) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        try:
            response = await conn.request(
                "POST", "/v1/classify", bodies[i % len(bodies)], headers, content_type="application/json"
            )
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            return 0, {}  # no answer at all: counted with the other answers
        return response.status, {}

    return request


# --- the open loop -------------------------------------------------------------------------------


@dataclass
class ClassAnswers:
    """One priority class's arrivals in an open-loop window."""

    arrivals: int = 0
    not_sent: int = 0  # every connection was waiting for an answer
    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # of the 200s, from the scheduled arrival

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def other(self) -> int:
        return sum(n for status, n in self.statuses.items() if status not in (200, 429, 504))

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)


@dataclass
class OpenWindow:
    """An open-loop window: arrivals at ``rate`` for ``duration_s``, then every answer awaited."""

    rate: float
    duration_s: float
    classes: dict[str, ClassAnswers]
    seconds: float = 0.0  # the first arrival to the last answer
    lag: list[float] = field(default_factory=list)  # how late the client sent each request it sent
    most_waiting: int = 0
    client_cpu_s: float = 0.0
    server_cpu_s: float = float("nan")
    server: dict[str, float] = field(default_factory=dict)  # the server's own figures over the window

    @property
    def sent(self) -> int:
        return sum(c.arrivals - c.not_sent for c in self.classes.values())

    @property
    def scheduled(self) -> int:
        return sum(c.arrivals for c in self.classes.values())


def merge_windows(windows: list[OpenWindow]) -> OpenWindow:
    merged = OpenWindow(windows[0].rate, 0.0, {c: ClassAnswers() for c in CLASSES}, server_cpu_s=0.0)
    for w in windows:
        merged.duration_s += w.duration_s
        merged.seconds += w.seconds
        merged.lag += w.lag
        merged.most_waiting = max(merged.most_waiting, w.most_waiting)
        merged.client_cpu_s += w.client_cpu_s
        merged.server_cpu_s += w.server_cpu_s
        for k, v in w.server.items():
            merged.server[k] = merged.server.get(k, 0.0) + v
        for name, c in w.classes.items():
            into = merged.classes[name]
            into.arrivals += c.arrivals
            into.not_sent += c.not_sent
            into.latencies += c.latencies
            for status, n in c.statuses.items():
                into.statuses[status] = into.statuses.get(status, 0) + n
    return merged


def high_at(i: int, share: float) -> bool:
    """Arrival ``i`` is high: exactly ``share`` of any run of arrivals, spread evenly."""
    return math.floor((i + 1) * share) > math.floor(i * share)


async def open_loop(
    server: ServiceProcess,
    bodies: dict[str, list[bytes]],
    headers: dict[str, dict[str, str]],
    rate: float,
    duration_s: float,
    high_share: float,
    connections: dict[str, int],
    seed: int,
) -> OpenWindow:
    """Poisson arrivals at ``rate`` for ``duration_s``, each sent at its time on an idle connection of its
    class's pool (``connections`` per class, opened first; none idle: not sent); every answer awaited."""
    pools = {
        name: [HTTPConnection("127.0.0.1", server.port, timeout_s=ANSWER_TIMEOUT_S) for _ in range(n)]
        for name, n in connections.items()
    }
    # Connected before the window, so that no arrival pays for a handshake.
    await asyncio.gather(*(conn.request("GET", "/health/live") for pool in pools.values() for conn in pool))
    window = OpenWindow(rate, duration_s, {c: ClassAnswers() for c in CLASSES})
    pending: set[asyncio.Task[None]] = set()
    waiting = 0

    async def send(conn: HTTPConnection, name: str, body: bytes, at: float) -> None:
        nonlocal waiting
        try:
            response = await conn.request(
                "POST", "/v1/classify", body, headers[name], content_type="application/json"
            )
            status = response.status
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            status = 0
        seconds = time.perf_counter() - at
        waiting -= 1
        answers = window.classes[name]
        answers.statuses[status] = answers.statuses.get(status, 0) + 1
        if status == 200:
            answers.latencies.append(seconds)
        pools[name].append(conn)

    rng = random.Random(seed)
    cpu0, server0 = time.process_time(), server.cpu_seconds()
    started = time.perf_counter()
    at, i = started, 0
    try:
        while True:
            at += rng.expovariate(rate)
            if at - started > duration_s:
                break
            now = time.perf_counter()
            if at > now:
                await asyncio.sleep(at - now)
            name = "high" if high_at(i, high_share) else "low"
            i += 1
            answers, idle = window.classes[name], pools[name]
            answers.arrivals += 1
            if not idle:
                answers.not_sent += 1
                continue
            conn = idle.pop()
            if not conn.is_open:  # the server closed it (its keep-alive timeout): the request reconnects
                await conn.close()
            window.lag.append(time.perf_counter() - at)
            choices = bodies[name]
            task = asyncio.create_task(send(conn, name, choices[i % len(choices)], at))
            pending.add(task)
            task.add_done_callback(pending.discard)
            waiting += 1
            window.most_waiting = max(window.most_waiting, waiting)
        if pending:
            await asyncio.gather(*pending)
        window.seconds = time.perf_counter() - started
        window.client_cpu_s = time.process_time() - cpu0
        window.server_cpu_s = server.cpu_seconds() - server0
    finally:
        for task in pending:
            task.cancel()
        for pool in pools.values():
            for conn in pool:
                await conn.close()
    return window


# --- the server's own figures ----------------------------------------------------------------------


def server_figures(server: ServiceProcess) -> dict[str, float]:
    """One read of /metrics: per class the queue wait (sum, count), displaced and expired items; the
    batches (count, items, compute seconds); refusals by reason."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    wanted = {
        "tserve_priority_wait_seconds_sum": "wait_s",
        "tserve_priority_wait_seconds_count": "waited",
        "tserve_priority_displaced_total": "displaced",
        "tserve_priority_expired_total": "expired",
    }
    whole = {
        "tserve_batch_size_count": "batches",
        "tserve_batch_size_sum": "batched_items",
        "tserve_compute_duration_seconds_sum": "compute_s",
        "tserve_queue_depth": "queue_depth",
        "tserve_requests_shed_total": "shed",
        "tserve_event_loop_lag_seconds_sum": "loop_lag_s",
        "tserve_event_loop_lag_seconds_count": "loop_ticks",
    }
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted:
                key = f"{wanted[s.name]}_{s.labels.get('priority', '')}"
            elif s.name in whole:
                key = whole[s.name]
            elif s.name == "tserve_requests_rejected_total":
                key = f"rejected_{s.labels.get('reason', '')}"
            else:
                continue
            out[key] = out.get(key, 0.0) + s.value
    return out


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def settle(server: ServiceProcess, seconds: float) -> None:
    """Let what still waits in the queue go (lows at their deadline, the rest computed) before the next
    window: at least ``seconds``, then until the model's queue is empty (``tserve_queue_depth``)."""
    time.sleep(seconds)
    deadline = time.monotonic() + 2 * ANSWER_TIMEOUT_S
    while server_figures(server).get("queue_depth", 0.0) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)


# --- the run ------------------------------------------------------------------------------------


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-classification")
    duration = opts.extra.get("duration") or (1.0 if opts.quick else 4.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    overload = float(opts.extra.get("overload") or OVERLOAD)
    overload_2 = float(opts.extra.get("overload_2", OVERLOAD_2) or 0.0)
    high_share = float(opts.extra.get("high_share") or HIGH_SHARE)
    low_timeout = opts.extra.get("low_timeout_ms")
    low_timeout_ms = LOW_TIMEOUT_MS if low_timeout is None else int(low_timeout)
    queue_size = int(opts.extra.get("queue_size") or QUEUE_SIZE)
    capacity_clients = int(opts.extra.get("capacity_clients") or CAPACITY_CLIENTS)
    idle_clients = int(opts.extra.get("idle_clients") or IDLE_CLIENTS)
    connections = {c: int(opts.extra.get(f"{c}_connections") or CONNECTIONS[c]) for c in CLASSES}
    warmup = 0.3 if opts.quick else 1.0
    pause = 0.3 if opts.quick else 1.0
    texts = sentiment_texts()
    in_header = opts.extra.get("priority_in", PRIORITY_IN) == "header"
    shed_lag_ms = float(os.environ.get("SHED_LAG_MS", Settings.model_fields["shed_lag_ms"].default))
    bodies = {
        "high": [classify_body(t, "high", 0, not in_header) for t in texts],
        "low": [classify_body(t, "low", low_timeout_ms, not in_header) for t in texts],
        "normal": [classify_body(t, None) for t in texts],
    }
    headers = {c: class_headers(None if c == "normal" else c, in_header) for c in CLASSES}
    settings = Settings.model_fields
    in_flight_limit = int(settings["max_in_flight_requests"].default)
    queue_timeout_s = float(settings["queue_timeout_s"].default)
    env = {"MAX_QUEUE_SIZE": str(queue_size), "MAX_ITEMS": str(min(queue_size, 32))}

    idle_runs: list[LoadPoint] = []
    overload_runs: list[OpenWindow] = []
    overload_2_runs: list[OpenWindow] = []
    with subset_repository([folder]) as repo, benchmark_server(repo, opts, env=env) as server:
        provider = providers(server)
        before = server_figures(server)
        capacity = run_async(
            closed_loop(
                server,
                capacity_clients,
                classify_request(bodies["normal"]),
                duration_s=duration,
                warmup_s=warmup,
            )
        )
        at_capacity = difference(server_figures(server), before)
        rate = overload * capacity.rps
        if not rate > 0:
            raise RuntimeError(
                f"no capacity measured: answers {capacity.statuses}; the end of the log:\n{server.log_tail()}"
            )
        settle(server, pause)
        windows = WINDOWS if overload_2 else WINDOWS[:2]
        for r in range(rounds):
            for mode in windows if r % 2 == 0 else windows[::-1]:
                if mode == "idle":
                    point = run_async(
                        closed_loop(
                            server,
                            idle_clients,
                            classify_request(bodies["high"], headers["high"]),
                            duration_s=duration,
                            warmup_s=warmup,
                        )
                    )
                    idle_runs.append(point)
                else:
                    before = server_figures(server)
                    at = rate if mode == "overload" else overload_2 * capacity.rps
                    window = run_async(
                        open_loop(server, bodies, headers, at, duration, high_share, connections, SEED + r)
                    )
                    window.server = difference(server_figures(server), before)
                    (overload_runs if mode == "overload" else overload_2_runs).append(window)
                    settle(server, pause)

    idle = merge_points(idle_runs)
    over = merge_windows(overload_runs)
    high, low = over.classes["high"], over.classes["low"]
    p99_ratio = ratio(high.p(99), idle.p(99))
    idle_other = sum(n for s, n in idle.statuses.items() if s not in (200, 429, 504))
    capacity_other = sum(n for s, n in capacity.statuses.items() if s not in (200, 429, 504))
    other = high.other + low.other + idle_other + capacity_other
    over_2 = merge_windows(overload_2_runs) if overload_2_runs else None
    p99_2x = ratio(over_2.classes["high"].p(99), idle.p(99)) if over_2 else None
    if over_2:
        other += sum(c.other for c in over_2.classes.values())
    srv = over.server
    sent_rate = ratio(over.sent, over.duration_s)
    ok_rate = ratio(high.ok + low.ok, over.seconds)

    def wait_ms(c: str) -> float:
        return ratio(srv.get(f"wait_s_{c}", 0.0), srv.get(f"waited_{c}", 0.0)) * 1e3

    metrics: dict[str, Any] = {
        "priority_high_p99_overload_over_idle": p99_ratio,
        **(
            {
                "priority_high_p99_2x_over_idle": p99_2x,
                "overload_2": overload_2,
                **{
                    f"overload_2_{name}_{key}": value
                    for name, c in over_2.classes.items()
                    for key, value in {
                        "p50_ms": c.p(50) * 1e3,
                        "p99_ms": c.p(99) * 1e3,
                        "arrivals": c.arrivals,
                        "not_sent": c.not_sent,
                        "statuses": c.statuses,
                    }.items()
                },
            }
            if over_2
            else {}
        ),
        "idle_high_p50_ms": idle.p(50) * 1e3,
        "idle_high_p99_ms": idle.p(99) * 1e3,
        "idle_rps": idle.rps,
        "capacity_rps": capacity.rps,
        "capacity_p50_ms": capacity.p(50) * 1e3,
        "capacity_p99_ms": capacity.p(99) * 1e3,
        "overload_rate_rps": rate,
        "overload_sent_rps": sent_rate,
        "overload_sent_over_capacity": ratio(sent_rate, capacity.rps),
        "overload_ok_rps": ok_rate,
        "overload_ok_over_capacity": ratio(ok_rate, capacity.rps),
        "overload_client_lag_p99_ms": percentile(over.lag, 99) * 1e3,
        "overload_most_waiting": over.most_waiting,
        "other_answers": other,
        "low_ok": low.ok,
        **{
            f"overload_{name}_{key}": value
            for name, c in over.classes.items()
            for key, value in {
                "p50_ms": c.p(50) * 1e3,
                "p99_ms": c.p(99) * 1e3,
                "arrivals": c.arrivals,
                "not_sent": c.not_sent,
                "statuses": c.statuses,
                "ok": c.ok,
                "other": c.other,
                "queue_wait_ms_mean": wait_ms(name),
                "displaced": srv.get(f"displaced_{name}", 0.0),
                "expired": srv.get(f"expired_{name}", 0.0),
            }.items()
        },
        "capacity_batch_size_mean": ratio(
            at_capacity.get("batched_items", 0.0), at_capacity.get("batches", 0.0)
        ),
        "capacity_model_call_ms": ratio(at_capacity.get("compute_s", 0.0), at_capacity.get("batches", 0.0))
        * 1e3,
        "overload_model_call_ms": ratio(srv.get("compute_s", 0.0), srv.get("batches", 0.0)) * 1e3,
        "overload_batches": srv.get("batches", 0.0),
        "overload_batch_size_mean": ratio(srv.get("batched_items", 0.0), srv.get("batches", 0.0)),
        "overload_compute_busy": ratio(srv.get("compute_s", 0.0), over.seconds),
        "overload": overload,
        "high_share": high_share,
        "low_timeout_ms": low_timeout_ms,
        "queue_size": queue_size,
        "connections": connections,
        "capacity_clients": capacity_clients,
        "idle_clients": idle_clients,
        "duration_s": duration,
        "rounds": rounds,
        "model": folder.name,
        "profiles": sorted(profiles([folder])),
    }

    built = profiles([folder])
    which = (
        "the **tiny test models** (the manifest's training profile is `tiny`: built in seconds for the tests; "
        "their figures describe the service's machinery, not production-sized models)"
        if built == {"tiny"}
        else f"a model built with the profile(s) {', '.join(sorted(built))}"
    )
    capacity_rows = [
        "| load | requests/s | p50 (ms) | p99 (ms) | answers | server cores | client cores |",
        "|---|---|---|---|---|---|---|",
        f"| capacity: {capacity_clients} closed-loop clients, normal priority | {capacity.rps:.1f} | "
        f"{capacity.p(50) * 1e3:.1f} | {capacity.p(99) * 1e3:.1f} | {_statuses(capacity.statuses)} | "
        f"{cores_used(capacity.server_cpu_s, capacity.seconds)} | "
        f"{cores_used(capacity.client_cpu_s, capacity.seconds)} |",
    ]
    window_rows = [
        "| window | round | class | arrivals | not sent | 200 | 429 | 504 | other | p50 of 200s (ms) | "
        "p99 of 200s (ms) | server cores | client cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, p in enumerate(idle_runs, 1):
        window_rows.append(_idle_row(f"idle ({idle_clients} client(s))", str(r), p))
    for r, w in enumerate(overload_runs, 1):
        window_rows += _overload_rows(f"overload {overload:g}x C", str(r), w)
    for r, w in enumerate(overload_2_runs, 1):
        window_rows += _overload_rows(f"overload {overload_2:g}x C", str(r), w)
    window_rows.append(_idle_row("**idle, all rounds**", "", idle, bold=True))
    window_rows += _overload_rows(f"**overload {overload:g}x, all rounds**", "", over, bold=True)
    if over_2:
        window_rows += _overload_rows(f"**overload {overload_2:g}x, all rounds**", "", over_2, bold=True)
    server_rows = [
        "| class | mean wait in the model's queue (ms) | items taken | displaced (429) | expired at their "
        "deadline (504) |",
        "|---|---|---|---|---|",
        *(
            f"| {c} | {wait_ms(c):.1f} | {srv.get(f'waited_{c}', 0.0):.0f} | "
            f"{srv.get(f'displaced_{c}', 0.0):.0f} | {srv.get(f'expired_{c}', 0.0):.0f} |"
            for c in CLASSES
        ),
    ]
    batch_rows = [
        "| load | batches | items per batch | model call per batch, as the batcher times it (ms) | "
        "share of the window in model calls |",
        "|---|---|---|---|---|",
        *(
            f"| {label} | {f.get('batches', 0.0):.0f} | "
            f"{ratio(f.get('batched_items', 0.0), f.get('batches', 0.0)):.1f} | "
            f"{ratio(f.get('compute_s', 0.0), f.get('batches', 0.0)) * 1e3:.2f} | "
            f"{ratio(f.get('compute_s', 0.0), seconds):.0%} |"
            for label, f, seconds in (
                (
                    f"capacity ({capacity_clients} clients, warm-up included)",
                    at_capacity,
                    capacity.seconds + warmup,
                ),
                (f"overload {overload:g}x C, all rounds", srv, over.seconds),
            )
        ),
    ]
    refused = ", ".join(
        f"{k.removeprefix('rejected_')}: {v:.0f}"
        for k, v in sorted(srv.items())
        if k.startswith("rejected_") and v
    )
    details = [
        f"Model `{folder.name}`: {which}. One server, only this model loaded, `MAX_QUEUE_SIZE={queue_size}`, "
        "the service's other defaults (MAX_BATCH_SIZE 32, QUEUE_TIMEOUT_S "
        f"{queue_timeout_s:g}, PRIORITY_AGING_S {PRIORITY_AGING_S:g}); `/v1/classify`, one SST-2 sentence per "
        f"request ({len(texts)} in rotation), `Cache-Control: no-cache, no-store`, the class in "
        + (
            "`X-Request-Priority` (the edge sheds low by it while the event loop lags over SHED_LAG_MS, "
            f"{shed_lag_ms:g} ms)."
            if in_header
            else "the body's `priority` (read too late to shed by)."
        ),
        "",
        *capacity_rows,
        "",
        f"Then {rounds} round(s) of an idle window and an overload window at each rate, of {duration:g} s each, taking turns (the order "
        f"swapped every round). Idle: {idle_clients} closed-loop client(s) sending `priority: high` (after "
        f"{warmup:g} s of warm-up). Overload: Poisson arrivals at {overload:g}x C = {rate:.0f}/s (seeded), "
        f"{high_share:.0%} `priority: high` (spread evenly), the rest `priority: low` with "
        + (f"`timeout_ms: {low_timeout_ms}`" if low_timeout_ms else "no timeout")
        + f"; each sent at its time on an idle keep-alive connection of its class ({connections['high']} for high, "
        f"{connections['low']} for low, opened before the window: together fewer than the service's "
        f"MAX_IN_FLIGHT_REQUESTS, {in_flight_limit}), else not sent; latency from the scheduled arrival; every answer awaited after the window, then the queue let empty. 'other': any answer but "
        "200, 429 and 504 (0: none at all).",
        "",
        *window_rows,
        "",
        f"Under overload the client sent {over.sent} of {over.scheduled} scheduled arrivals "
        f"({sent_rate:.0f}/s, {ratio(sent_rate, capacity.rps):.1f}x C; at most {over.most_waiting} waiting at "
        f"once; sent {percentile(over.lag, 99) * 1e3:.1f} ms late at p99) and got {ok_rate:.0f} answers 200 a "
        f"second ({ratio(ok_rate, capacity.rps):.2f}x C).",
        "",
        "The server's own figures over the overload windows (`tserve_priority_*`: the time from an item's "
        "queueing to its batch; what a 429 or 504 removed from the queue):",
        "",
        *server_rows,
        "",
        "The batches (`tserve_batch_size`; `tserve_compute_duration_seconds`, which the batcher times on the "
        "event loop: from handing the batch to its compute thread until the loop resumes it with the results, "
        "so a busy loop lengthens it):",
        "",
        *batch_rows,
        "",
        f"Refused by the model's queue under overload, by reason: {refused or 'none'}. Shed at the edge "
        f"(429 `shed`): {srv.get('shed', 0):.0f}. The event loop's mean lag over the overload windows: "
        f"{1e3 * srv.get('loop_lag_s', 0) / max(1.0, srv.get('loop_ticks', 0)):.1f} ms (a timer due every "
        "10 ms, `tserve_event_loop_lag_seconds`).",
        "",
        f"High-priority p99, overload over idle: **{p99_ratio:.2f}x** ({high.p(99) * 1e3:.1f} ms against "
        f"{idle.p(99) * 1e3:.1f} ms; p50 {high.p(50) * 1e3:.1f} against {idle.p(50) * 1e3:.1f} ms)"
        + (
            f"; at {overload_2:g}x: **{p99_2x:.2f}x** ({over_2.classes['high'].p(99) * 1e3:.1f} ms)."
            if over_2 and p99_2x is not None
            else "."
        )
        + " Low "
        f"priority under overload: **{low.ok} answered 200** of {low.arrivals - low.not_sent} sent. Answers "
        f"other than 200, 429 and 504 in every window: **{other}**.",
    ]
    checks = [
        Check(
            f"high-priority p99 at {overload:g}x overload over idle",
            p99_ratio,
            TARGET_HIGH_P99,
            higher_is_better=False,
        ),
        *(
            [
                Check(
                    f"high-priority p99 at {overload_2:g}x overload over idle",
                    p99_2x,
                    TARGET_HIGH_P99_2X,
                    higher_is_better=False,
                )
            ]
            if p99_2x is not None
            else []
        ),
        Check("low-priority 200s under overload", float(low.ok), 1, unit=""),
        Check("answers other than 200, 429 and 504", float(other), 0, higher_is_better=False, unit=""),
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


def _statuses(statuses: dict[int, int]) -> str:
    return ", ".join(f"{s or 'no answer'}: {n}" for s, n in sorted(statuses.items())) or "none"


def _idle_row(label: str, r: str, p: LoadPoint, bold: bool = False) -> str:
    other = sum(n for s, n in p.statuses.items() if s not in (200, 429, 504))
    p99 = f"{p.p(99) * 1e3:.1f}"
    return (
        f"| {label} | {r} | high | {sum(p.statuses.values())} | | {p.statuses.get(200, 0)} | "
        f"{p.statuses.get(429, 0)} | {p.statuses.get(504, 0)} | {other} | {p.p(50) * 1e3:.1f} | "
        f"{f'**{p99}**' if bold else p99} | {cores_used(p.server_cpu_s, p.seconds)} | "
        f"{cores_used(p.client_cpu_s, p.seconds)} |"
    )


def _overload_rows(label: str, r: str, w: OpenWindow, bold: bool = False) -> list[str]:
    rows = []
    for name, c in w.classes.items():
        p99 = f"{c.p(99) * 1e3:.1f}"
        rows.append(
            f"| {label} | {r} | {name} | {c.arrivals} | {c.not_sent} | {c.ok} | {c.statuses.get(429, 0)} | "
            f"{c.statuses.get(504, 0)} | {c.other} | {c.p(50) * 1e3:.1f} | "
            f"{f'**{p99}**' if bold and name == 'high' else p99} | "
            f"{cores_used(w.server_cpu_s, w.seconds)} | {cores_used(w.client_cpu_s, w.seconds)} |"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
