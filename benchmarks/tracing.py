"""(t) What traces cost: served classify throughput with traces off, on with 1% of requests sampled, and on
with every request sampled, at 32 closed-loop clients.

Three real servers (``python -m service``, only the text classifier loaded) run side by side and take
turns, round by round: one with no OTLP endpoint (traces off: no middleware, no provider, no span), two
exporting over OTLP/gRPC to a collector in this process, with ``OTEL_TRACES_SAMPLER=traceidratio`` at
0.01 and ``always_on``. The collector is a sink: grpcio's server answering ``TraceService/Export`` with
the bytes unread (a real collector runs elsewhere; parsing here would charge the service's cores for
it). Requests carry no ``traceparent``: each is the root of its own trace, as at the edge of a system.
Each request classifies one SST-2 validation sentence with ``Cache-Control: no-cache, no-store``.
Reported per server: requests/s, p50, p99, the server's CPU per request, and the spans it dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/tracing.py` anywhere

from benchmarks.batching import classify_request
from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import LoadPoint, closed_loop, merge_points
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.service_process import ServiceProcess
from harness.stats import ratio

NAME = "tracing"
TITLE = "(t) Traces: served classify throughput with every request sampled vs traces off, 32 clients"
CLIENTS = 32
TARGET = 0.97  # at most 3% fewer requests/s with every request traced
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SIDES = {
    "off": {},
    "sampled 1%": {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "sampled 100%": {"OTEL_TRACES_SAMPLER": "always_on"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per window (default 5, quick 0.5)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")


class CollectorSink:
    """An OTLP/gRPC endpoint that accepts every export and reads none: bytes and calls counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0
        self._lock = threading.Lock()

        def export(request: bytes, _context: object) -> bytes:
            with self._lock:
                self.calls += 1
                self.bytes += len(request)
            return b""  # an empty ExportTraceServiceResponse: everything accepted

        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export)},
        )
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @contextlib.contextmanager
    def running(self) -> Iterator[CollectorSink]:
        self.server.start()
        try:
            yield self
        finally:
            self.server.stop(grace=None)


def dropped(server: ServiceProcess) -> float:
    """Spans the server dropped, for any reason (``tserve_trace_spans_dropped_total``)."""
    total = 0.0
    for line in server.get_text("/metrics").splitlines():
        if line.startswith("tserve_trace_spans_dropped_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run(opts: Options) -> Result:
    folder = find_model(opts.models, "text-classification")
    duration = opts.extra.get("duration") or (0.5 if opts.quick else 5.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    warmup = 0.2 if opts.quick else 1.0
    texts = sentiment_texts()
    request = classify_request(texts)
    runs: dict[str, list[LoadPoint]] = {side: [] for side in SIDES}
    sink = CollectorSink()
    with subset_repository([folder]) as repo, sink.running(), contextlib.ExitStack() as stack:
        endpoint = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{sink.port}",
            "OTEL_SERVICE_NAME": "transformer-serving-benchmark",
        }
        servers = {
            side: stack.enter_context(benchmark_server(repo, opts, env={**endpoint, **env} if env else {}))
            for side, env in SIDES.items()
        }
        provider = providers(servers["off"])
        for _ in range(rounds):
            for side, server in servers.items():
                runs[side].append(
                    run_async(closed_loop(server, CLIENTS, request, duration_s=duration, warmup_s=warmup))
                )
        lost = {side: dropped(server) for side, server in servers.items()}
    points = {side: merge_points(ps) for side, ps in runs.items()}

    off = points["off"]
    metrics: dict[str, object] = {"model": folder.name, "clients": CLIENTS, "duration_s": duration}
    rows = [
        "| traces | req/s | vs off | p50 ms | p99 ms | server CPU ms/request | server cores | spans dropped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side, point in points.items():
        key = side.replace(" ", "_").replace("%", "pct")
        metrics[f"rps_{key}"] = point.rps
        metrics[f"errors_{key}"] = point.errors
        metrics[f"spans_dropped_{key}"] = lost[side]
        cpu_ms = ratio(point.server_cpu_s * 1e3, point.requests)
        rows.append(
            f"| {side} | {point.rps:.1f} | {ratio(point.rps, off.rps):.3f}x | {point.p(50) * 1e3:.1f} | "
            f"{point.p(99) * 1e3:.1f} | {cpu_ms:.2f} | {cores_used(point.server_cpu_s, point.seconds)} | "
            f"{lost[side]:.0f} |"
        )
    metrics["traced_over_untraced_32"] = ratio(points["sampled 100%"].rps, off.rps)
    metrics["sampled_1pct_over_untraced_32"] = ratio(points["sampled 1%"].rps, off.rps)

    metrics["collector_export_calls"] = sink.calls
    metrics["collector_bytes"] = sink.bytes
    errors = sum(p.errors for p in points.values())
    details = [
        *rows,
        "",
        f"Model `{folder.name}`, {CLIENTS} closed-loop clients, one SST-2 validation sentence per request "
        f"({len(texts)} in rotation), `Cache-Control: no-cache, no-store`, no `traceparent`; {rounds} round(s) "
        f"of {duration:g} s per server (after {warmup:g} s of warm-up each), the three servers taking turns. "
        f"The collector (a sink in the benchmark process) took {sink.calls} export calls, "
        f"{sink.bytes / 1e6:.1f} MB. Non-200 answers: {errors}.",
    ]
    checks = [
        Check(
            "Traced (every request) over untraced, 32 clients",
            float(metrics["traced_over_untraced_32"]),
            TARGET,
        )
    ]  # type: ignore[arg-type]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
