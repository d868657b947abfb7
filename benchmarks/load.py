"""Closed-loop load on a benchmark's server: clients that each send their next request when the last returns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import percentile, ratio

# Throughput benchmarks must never be answered by the response cache: no lookup (no-cache), and
# nothing stored either (no-store), so the cache costs them nothing and does not grow.
BYPASS_CACHE = {"Cache-Control": "no-cache, no-store"}
MISS = {"Cache-Control": "no-cache"}  # a cache miss on purpose: computed fresh (and stored)


@dataclass
class LoadPoint:
    """A closed-loop load: ``concurrency`` clients, each sending its next request when the last one returns."""

    concurrency: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)  # per-request figures a request fn reports
    client_cpu_s: float = 0.0
    server_cpu_s: float = float("nan")
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return ratio(self.requests, self.seconds)

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)

    def total(self, key: str) -> float:
        return float(sum(self.extra.get(key, [])))


def merge_points(points: Sequence[LoadPoint]) -> LoadPoint:
    """Several measurements of the same load as one: counts, times and samples added up."""
    merged = LoadPoint(points[0].concurrency, server_cpu_s=0.0)
    for p in points:
        merged.requests += p.requests
        merged.errors += p.errors
        merged.seconds += p.seconds
        merged.latencies += p.latencies
        merged.client_cpu_s += p.client_cpu_s
        merged.server_cpu_s += p.server_cpu_s
        for k, v in p.extra.items():
            merged.extra.setdefault(k, []).extend(v)
        for status, n in p.statuses.items():
            merged.statuses[status] = merged.statuses.get(status, 0) + n
    return merged


# A request function: (connection, request number) -> (HTTP status, per-request figures).
RequestFn = Callable[[HTTPConnection, int], Awaitable[tuple[int, dict[str, float]]]]


async def closed_loop(
    server: ServiceProcess,
    concurrency: int,
    request: RequestFn,
    *,
    duration_s: float,
    warmup_s: float = 0.5,
) -> LoadPoint:
    """Warm up for ``warmup_s``, then measure for ``duration_s``: no client starts a request after that.

    One keep-alive connection per client. Only requests started inside the window count; the window
    closes when the last of them returns.
    """
    connections = [HTTPConnection("127.0.0.1", server.port) for _ in range(concurrency)]
    counter = iter(range(10**12))
    try:
        if warmup_s > 0:
            warm_until = time.perf_counter() + warmup_s

            async def warm(conn: HTTPConnection) -> None:
                while time.perf_counter() < warm_until:
                    await request(conn, next(counter))

            await asyncio.gather(*(warm(c) for c in connections))
        point = LoadPoint(concurrency)
        cpu0, server0 = time.process_time(), server.cpu_seconds()
        started = time.perf_counter()
        until = started + duration_s

        async def worker(conn: HTTPConnection) -> None:
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                status, figures = await request(conn, next(counter))
                point.latencies.append(time.perf_counter() - t0)
                point.statuses[status] = point.statuses.get(status, 0) + 1
                if status == 200:
                    point.requests += 1
                    for k, v in figures.items():
                        point.extra.setdefault(k, []).append(v)
                else:
                    point.errors += 1

        await asyncio.gather(*(worker(c) for c in connections))
        point.seconds = time.perf_counter() - started
        point.client_cpu_s = time.process_time() - cpu0
        point.server_cpu_s = server.cpu_seconds() - server0
    finally:
        for conn in connections:
            await conn.close()
    return point
