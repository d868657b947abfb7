#!/usr/bin/env python
"""Overload and soak: offer a multiple of the measured capacity and check that the service sheds load.

The contract (docs/SERVING.md, and the errors in docs/API.md) under overload:

- every answer is 200, or 429 / 503 with a ``Retry-After`` of at least one second:
  no other 5xx, no dropped connection, no request left hanging;
- the queues are bounded: some requests are refused, no model's queue depth
  (``tserve_queue_depth``) ever exceeds ``MAX_QUEUE_SIZE``, and the server never holds the
  client's cap of open requests (``--max-outstanding``: nothing piles up before the queues);
- an admitted request (200) finishes within ``QUEUE_TIMEOUT_S`` plus its compute time;
- the server's resident memory stays bounded: its peak during overload stays within a
  stated growth over the level after warm-up, and does not climb from phase to phase;
- afterwards the process is alive, ``/health/ready`` answers 200 and ``/metrics`` counts
  the refusals (``tserve_requests_rejected_total{reason="queue_full"}``).

How: first a closed loop at a concurrency that cannot overflow the queues measures each
endpoint's capacity (admitted requests per second); then an open loop offers ``--factor``
times that rate per endpoint (arrivals on a fixed schedule, whatever the answers) for
``--duration`` seconds, in phases of ``--phase-seconds``, sampling the server's VmRSS
(``/proc/<pid>/status``) and queue depths throughout. The mix is beam-search translation
(``/v1/translate``, the dynamic batcher's queue) and sampled generation (``/v1/generate``,
the continuous-batching queue); each body is unique, so no response cache can answer it.

    python loadtests/overload.py --models models/ --duration 300 --factor 10

launches ``python -m service`` on a free loopback port with a small queue
(``--max-queue-size``, ``--queue-timeout``, cache off, one worker, ``--server-env NAME=VALUE``
for any other setting) and prints a table per phase and endpoint: target and offered rates,
accepted rate, admitted latency p50/p95/p99/max, refusal latency, peak RSS, status counts
and the most requests open at once. It exits 1 when the contract is broken (each breach is
listed), 2 on a usage or start-up error; ``--json`` keeps the report. ``--url URL --pid PID``
drives a server that is already running instead (give its ``--max-queue-size`` /
``--queue-timeout``; ``--pid`` is the worker's pid on this machine, without it RSS is not
checked). The test ``tests/reliability/test_overload.py`` runs the same code for a few
seconds against the tiny models.

Client and server share the machine: the offered rate actually reached is reported next
to the target (``offered/s``), and on a small machine it may fall short of ``--factor``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]  # overload_driver, overload_report, harness/
from overload_driver import (  # noqa: E402
    ENDPOINTS,
    Endpoint,
    Limits,
    MetricsPoller,
    MiB,
    Record,
    RssSampler,
    closed_loop,
    open_loop,
    parse_metrics,
)
from overload_report import Report, check, summarize  # noqa: E402

from harness.event_loop import run_async  # noqa: E402
from harness.http_client import HTTPClient  # noqa: E402
from harness.json_file import write_json  # noqa: E402
from harness.service_process import ServiceProcess  # noqa: E402

# --- the run ----------------------------------------------------------------------------------------


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except OSError:
        return False


async def served_endpoints(client: HTTPClient, items: int) -> list[Endpoint]:
    """The endpoints of the mix whose task has a loaded model, with ``items`` inputs per request."""
    models = (await client.get("/v1/models")).json()
    tasks = {m.get("task") for m in models.get("data", [])}
    return [replace(e, items=items) for e in ENDPOINTS if e.model_task in tasks]


async def run_overload(
    url: str,
    pid: int | None,
    limits: Limits,
    *,
    factor: float = 10.0,
    capacity_s: float = 10.0,
    duration_s: float = 60.0,
    phase_s: float = 30.0,
    max_outstanding: int = 2000,
    items: int = 1,
    api_key: str | None = None,
    log: Callable[[str], None] = print,
) -> Report:
    """Measure capacity, then offer ``factor`` x capacity for ``duration_s`` in phases; return the report.

    ``pid``: the server process whose RSS is sampled (None: not sampled, not checked).
    ``items``: inputs per request; more make each request dearer to compute but not to refuse.
    """
    phases = max(2, math.ceil(duration_s / phase_s))
    phase_s = duration_s / phases
    client = HTTPClient(url, api_key=api_key)
    with RssSampler(pid) as rss:
        try:
            endpoints = await served_endpoints(client, items)
            if not endpoints:
                raise RuntimeError(f"{url} serves no translation or text-generation model")

            log(f"capacity: closed loop for {capacity_s:g} s ({', '.join(e.kind for e in endpoints)})")
            started = time.monotonic()
            records = await closed_loop(
                client, endpoints, capacity_s, limits.client_timeout_s, limits.max_queue_size
            )
            seconds = time.monotonic() - started
            capacity = {
                e.kind: sum(r.kind == e.kind and r.status == 200 for r in records) / seconds
                for e in endpoints
            }
            report = Report(limits, factor, capacity, items)
            report.phases.append(
                summarize(
                    "capacity", "all", records, seconds, seconds, peak_rss=rss.peak(started, time.monotonic())
                )
            )
            if not all(capacity.values()):
                raise RuntimeError(f"an endpoint admitted nothing in the capacity phase: {report.table()}")
            await asyncio.sleep(1.0)
            baseline = rss.last(time.monotonic())
            report.baseline_rss_mib = None if baseline is None else baseline / MiB

            rates = {kind: factor * c for kind, c in capacity.items()}
            overload: list[Record] = []
            async with MetricsPoller(url, api_key=api_key) as poller:
                for n in range(1, phases + 1):
                    log(f"overload {n}/{phases}: {phase_s:.0f} s at {sum(rates.values()):.1f} requests/s")
                    started = time.monotonic()
                    records, skipped, peak_open = await open_loop(
                        client, rates, endpoints, phase_s, limits.client_timeout_s, n * 10**6, max_outstanding
                    )
                    seconds = time.monotonic() - started
                    peak = rss.peak(started, time.monotonic())
                    report.overload_peaks_mib.append(None if peak is None else peak / MiB)
                    name = f"overload {n}"
                    total = sum(rates.values())
                    report.phases.append(
                        summarize(name, "all", records, phase_s, seconds, total, peak, skipped, peak_open)
                    )
                    for e in endpoints:
                        mine = [r for r in records if r.kind == e.kind]
                        report.phases.append(summarize(name, e.kind, mine, phase_s, seconds, rates[e.kind]))
                    overload += records
                    await asyncio.sleep(1.0)
            report.max_queue_depth = poller.max_depth

            report.ready_after = (await client.get("/health/ready")).status
            metrics = (await client.get("/metrics")).body.decode()
            report.rejected_queue_full = sum(
                v
                for labels, v in parse_metrics(metrics, "tserve_requests_rejected_total")
                if labels.get("reason") == "queue_full"
            )
        finally:
            await client.close()
    report.alive_after = None if pid is None else _process_alive(pid)
    report.violations = check(report, overload)
    return report


def run(url: str, pid: int | None, limits: Limits, **options: Any) -> Report:
    """``run_overload`` on a fresh event loop (uvloop when installed: a cheaper client)."""
    return run_async(run_overload(url, pid, limits, **options))


# --- the command --------------------------------------------------------------------------------------


def service_env(limits: Limits, threads: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The settings of a service under test: this run's queue, one worker, no response cache."""
    return {
        "WORKERS": "1",
        "LOG_LEVEL": "warning",
        "CACHE_ENABLED": "false",
        "MAX_QUEUE_SIZE": str(limits.max_queue_size),
        "MAX_ITEMS": str(min(32, limits.max_queue_size)),
        "QUEUE_TIMEOUT_S": str(limits.queue_timeout_s),
        "INTRA_OP_THREADS": str(threads),
        **(extra or {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--models", type=Path, help="model repository: launch the service on it")
    where.add_argument("--url", help="drive a service that is already running")
    parser.add_argument("--pid", type=int, help="with --url: the server process, for RSS")
    parser.add_argument("--api-key", help="with --url: sent as Authorization: Bearer KEY")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of overload (default 300)")
    parser.add_argument(
        "--phase-seconds", type=float, default=30.0, help="overload phase length (default 30)"
    )
    parser.add_argument("--factor", type=float, default=10.0, help="offered rate / capacity (default 10)")
    parser.add_argument("--capacity-seconds", type=float, default=10.0, help="capacity phase (default 10)")
    parser.add_argument("--max-queue-size", type=int, default=16, help="MAX_QUEUE_SIZE (default 16)")
    parser.add_argument("--queue-timeout", type=float, default=5.0, help="QUEUE_TIMEOUT_S (default 5)")
    parser.add_argument("--compute-bound", type=float, default=10.0, help="seconds of compute allowed (10)")
    parser.add_argument("--rss-growth-mib", type=float, default=256.0, help="RSS growth bound (256 MiB)")
    parser.add_argument("--rss-phase-slack-mib", type=float, default=32.0, help="phase-to-phase slack (32)")
    parser.add_argument("--items", type=int, default=1, help="inputs per request (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="INTRA_OP_THREADS when launching (default 1)")
    parser.add_argument("--max-outstanding", type=int, default=2000, help="client's open-request cap (2000)")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another setting for the launched service, e.g. MAX_BATCH_SIZE=4 (repeatable)",
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument(
        "--log", type=Path, help="the launched service's log (default: a file in the temporary directory)"
    )
    args = parser.parse_args(argv)

    limits = Limits(
        max_queue_size=args.max_queue_size,
        queue_timeout_s=args.queue_timeout,
        compute_bound_s=args.compute_bound,
        rss_growth_mib=args.rss_growth_mib,
        rss_phase_slack_mib=args.rss_phase_slack_mib,
    )
    extra_env = dict(item.split("=", 1) for item in args.server_env if "=" in item)
    if len(extra_env) != len(args.server_env):
        parser.error("--server-env takes NAME=VALUE")
    service: ServiceProcess | None = None
    try:
        if args.models is not None:
            if not args.models.is_dir():
                parser.error(f"--models {args.models} is not a directory")
            log_path = args.log or Path(tempfile.mkstemp(prefix="overload-service-", suffix=".log")[1])
            print(f"launching the service on {args.models} (log: {log_path})", flush=True)
            env = {"MODEL_REPOSITORY": str(args.models), **service_env(limits, args.threads, extra_env)}
            service = ServiceProcess(env, log_path=log_path, stop_grace_s=60).start(ready_timeout_s=600)
            assert service.proc is not None
            url, pid = service.url, service.proc.pid
        else:
            url, pid = args.url.rstrip("/"), args.pid
        report = run(
            url,
            pid,
            limits,
            factor=args.factor,
            capacity_s=args.capacity_seconds,
            duration_s=args.duration,
            phase_s=args.phase_seconds,
            max_outstanding=args.max_outstanding,
            items=args.items,
            api_key=args.api_key,
            log=lambda line: print(line, flush=True),
        )
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if service is not None:
            service.stop()
    print()
    print(report.table())
    if args.json is not None:
        write_json(args.json, asdict(report))
    if report.violations:
        print("\nCONTRACT BROKEN:", *report.violations, sep="\n- ")
        return 1
    print("\ncontract held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
