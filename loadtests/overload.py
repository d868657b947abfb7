#!/usr/bin/env python
"""Overload and soak: offer a multiple of the measured capacity and check that the service sheds load.

The contract (README, "Serving behaviour" and errors) under overload:

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
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python loadtests/overload.py` anywhere: harness/

from harness.event_loop import run_async  # noqa: E402
from harness.http_client import HTTPClient  # noqa: E402
from harness.json_file import write_json  # noqa: E402
from harness.service_process import ServiceProcess  # noqa: E402
from harness.stats import percentile  # noqa: E402

MiB = 1024 * 1024

SENTENCES = [
    "A man is riding a bicycle down the street.",
    "Two dogs are playing in the snow.",
    "A woman in a red dress is singing on a stage.",
    "Children are running through a field of flowers.",
    "An old man reads a newspaper on a park bench.",
    "A group of people stand in front of a building.",
    "The girl is holding a small white cat.",
    "A young boy jumps into a swimming pool.",
]
PROMPTS = ["ROMEO:\n", "KING:\n", "First Citizen:\n", "JULIET:\nO ", "HAMLET:\nTo be"]


# --- what is offered --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One kind of request: the model it needs, its path, and a unique body: ``body(i, items)`` for
    request number ``i`` with ``items`` inputs."""

    kind: str
    model_task: str
    path: str
    body: Callable[[int, int], dict[str, Any]]
    closed_loop_concurrency: int  # capacity phase: at most this many in flight (below MAX_QUEUE_SIZE)
    items: int = 1  # inputs per request (texts, prompts)


def translate_body(i: int, items: int = 1) -> dict[str, Any]:
    # The number makes every text, and so every cache key, unique.
    texts = [f"{SENTENCES[(i + k) % len(SENTENCES)][:-1]} number {i}." for k in range(items)]
    inputs: dict[str, Any] = {"text": texts[0]} if items == 1 else {"texts": texts}
    return {**inputs, "beam_size": 4, "max_new_tokens": 48}


def generate_body(i: int, items: int = 1) -> dict[str, Any]:
    prompts = [PROMPTS[(i + k) % len(PROMPTS)] for k in range(items)]
    inputs: dict[str, Any] = {"prompt": prompts[0]} if items == 1 else {"prompts": prompts}
    return {**inputs, "max_new_tokens": 48, "temperature": 0.8, "seed": i}


ENDPOINTS = [
    Endpoint("translate", "translation", "/v1/translate", translate_body, closed_loop_concurrency=8),
    Endpoint("generate", "text-generation", "/v1/generate", generate_body, closed_loop_concurrency=4),
]


@dataclass(frozen=True)
class Limits:
    """The server's settings the contract refers to, and the bounds this run holds it to."""

    max_queue_size: int  # MAX_QUEUE_SIZE
    queue_timeout_s: float  # QUEUE_TIMEOUT_S
    compute_bound_s: float = 10.0  # longest compute an admitted request may add to its queue wait
    rss_growth_mib: float = 256.0  # peak RSS in overload minus RSS after warm-up
    rss_phase_slack_mib: float = 32.0  # peak of the later half of the phases over that of the earlier half
    client_grace_s: float = 5.0  # the client waits this long past the bound, to tell "late" from "hung"

    @property
    def admitted_bound_s(self) -> float:
        return self.queue_timeout_s + self.compute_bound_s

    @property
    def client_timeout_s(self) -> float:
        return self.admitted_bound_s + self.client_grace_s


# --- measuring ----------------------------------------------------------------------------------


@dataclass
class Record:
    """One request's outcome: ``status`` 0 when no HTTP answer came (``error`` says why)."""

    kind: str
    sent_s: float  # since the phase started
    latency_s: float
    status: int
    retry_after: str | None = None
    error_type: str | None = None  # the JSON error's type (queue_full, queue_timeout, ...)
    error: str | None = None  # client side: timeout, connection error


def read_rss(pid: int) -> int | None:
    """VmRSS of ``pid`` in bytes, or None when it cannot be read (gone, or another machine)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class RssSampler:
    """Samples a process's VmRSS in a thread (so a busy event loop cannot delay it) every ``interval_s``."""

    def __init__(self, pid: int | None, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []  # (monotonic time, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = read_rss(self.pid) if self.pid is not None else None
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def peak(self, start: float, end: float) -> int | None:
        values = [rss for t, rss in self.samples if start <= t <= end]
        return max(values) if values else None

    def last(self, before: float) -> int | None:
        values = [rss for t, rss in self.samples if t <= before]
        return values[-1] if values else None


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def parse_metrics(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` in the Prometheus text format, as (labels, value)."""
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match["labels"] or ""))
            found.append((labels, float(match["value"])))
    return found


async def one_request(
    client: HTTPClient, endpoint: Endpoint, i: int, phase_start: float, timeout_s: float
) -> Record:
    started = time.monotonic()
    record = Record(endpoint.kind, started - phase_start, 0.0, 0)
    try:
        response = await client.request("POST", endpoint.path, endpoint.body(i, endpoint.items), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        record.error = f"no answer within the client timeout ({timeout_s:g} s)"
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    else:
        record.status = response.status
        record.retry_after = response.headers.get("retry-after")
        if response.status != 200:
            try:
                record.error_type = response.json()["error"]["type"]
            except (ValueError, KeyError, TypeError):
                record.error_type = None
    record.latency_s = time.monotonic() - started
    return record


async def closed_loop(
    client: HTTPClient,
    endpoints: Sequence[Endpoint],
    duration_s: float,
    timeout_s: float,
    max_queue_size: int,
) -> list[Record]:
    """Per endpoint, ``closed_loop_concurrency`` workers (never more than a queue holds) send one
    request after another for ``duration_s``."""
    start = time.monotonic()
    records: list[Record] = []
    counter = iter(range(10**9))

    async def worker(endpoint: Endpoint) -> None:
        while time.monotonic() - start < duration_s:
            records.append(await one_request(client, endpoint, next(counter), start, timeout_s))

    workers = [
        worker(e)
        for e in endpoints
        for _ in range(max(1, min(e.closed_loop_concurrency, max_queue_size // e.items)))
    ]
    await asyncio.gather(*workers)
    return records


async def open_loop(
    client: HTTPClient,
    rates: dict[str, float],
    endpoints: Sequence[Endpoint],
    duration_s: float,
    timeout_s: float,
    first_index: int,
    max_outstanding: int,
) -> tuple[list[Record], int, int]:
    """Arrivals at fixed rates (requests/s per kind) for ``duration_s``, whatever the answers.

    Returns the records, how many arrivals the client could not send because
    ``max_outstanding`` requests were already open (the server holds them all: something
    queues without bound), and the most requests open at once.
    """
    start = time.monotonic()
    records: list[Record] = []
    tasks: set[asyncio.Task[None]] = set()
    skipped = peak_open = 0
    counter = iter(range(first_index, first_index + 10**9))

    async def send(endpoint: Endpoint, i: int) -> None:
        records.append(await one_request(client, endpoint, i, start, timeout_s))

    async def arrivals(endpoint: Endpoint, rate: float) -> None:
        nonlocal skipped, peak_open
        n = 0
        while (due := start + n / rate) < start + duration_s:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            n += 1
            if len(tasks) >= max_outstanding:
                skipped += 1
                continue
            task = asyncio.create_task(send(endpoint, next(counter)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            peak_open = max(peak_open, len(tasks))

    await asyncio.gather(*(arrivals(e, rates[e.kind]) for e in endpoints if rates.get(e.kind, 0) > 0))
    while tasks:
        await asyncio.gather(*list(tasks))
    return records, skipped, peak_open


class MetricsPoller:
    """Reads ``/metrics`` every ``interval_s`` on its own connection: the deepest queue seen per model."""

    def __init__(self, url: str, interval_s: float = 0.5, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key
        self.interval_s = interval_s
        self.max_depth: dict[str, float] = {}
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        client = HTTPClient(self.url, api_key=self.api_key)
        try:
            while True:
                try:
                    text = (await client.get("/metrics")).body
                except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    self.failures += 1
                else:
                    for labels, value in parse_metrics(text.decode(), "tserve_queue_depth"):
                        model = labels.get("model", "?")
                        self.max_depth[model] = max(self.max_depth.get(model, 0.0), value)
                await asyncio.sleep(self.interval_s)
        finally:
            await client.close()

    async def __aenter__(self) -> MetricsPoller:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


# --- summarising ----------------------------------------------------------------------------------


@dataclass
class PhaseSummary:
    name: str
    kind: str  # an endpoint kind, or "all"
    seconds: float  # until the last answer came
    target_rate: float | None  # requests/s asked of the open loop (None: closed loop)
    offered_rate: float  # requests/s actually sent, over the time they were offered
    accepted_rate: float  # 200s per second, until the last answer
    statuses: dict[str, int]  # "200", "429", "503", ..., "client error"
    p50_s: float  # admitted latency (NaN: none admitted)
    p95_s: float
    p99_s: float
    max_s: float
    refused_p50_s: float = math.nan  # 429/503: how fast a refusal comes back
    refused_p99_s: float = math.nan
    peak_rss_mib: float | None = None
    skipped: int = 0  # arrivals the client could not send (too many open requests)
    peak_open: int | None = None  # most requests open at once (open loop)


def summarize(
    name: str,
    kind: str,
    records: Sequence[Record],
    offered_s: float,
    seconds: float,
    target_rate: float | None = None,
    peak_rss: int | None = None,
    skipped: int = 0,
    peak_open: int | None = None,
) -> PhaseSummary:
    """``offered_s``: how long requests were being sent; ``seconds``: until the last answer."""
    statuses = Counter(str(r.status) if r.status else "no answer" for r in records)
    admitted = [r.latency_s for r in records if r.status == 200]
    refused = [r.latency_s for r in records if r.status in (429, 503)]
    return PhaseSummary(
        name=name,
        kind=kind,
        seconds=seconds,
        target_rate=target_rate,
        offered_rate=len(records) / max(offered_s, 1e-9),
        accepted_rate=len(admitted) / max(seconds, 1e-9),
        statuses=dict(sorted(statuses.items())),
        p50_s=percentile(admitted, 50),
        p95_s=percentile(admitted, 95),
        p99_s=percentile(admitted, 99),
        max_s=max(admitted, default=math.nan),
        refused_p50_s=percentile(refused, 50),
        refused_p99_s=percentile(refused, 99),
        peak_rss_mib=None if peak_rss is None else peak_rss / MiB,
        skipped=skipped,
        peak_open=peak_open,
    )


@dataclass
class Report:
    limits: Limits
    factor: float
    capacity: dict[str, float]  # admitted requests/s per kind, closed loop
    items: int = 1  # inputs per request
    phases: list[PhaseSummary] = field(default_factory=list)
    baseline_rss_mib: float | None = None  # after warm-up (the capacity phase), before overload
    overload_peaks_mib: list[float | None] = field(default_factory=list)
    max_queue_depth: dict[str, float] = field(default_factory=dict)
    rejected_queue_full: float | None = None  # tserve_requests_rejected_total{reason="queue_full"}, summed
    ready_after: int | None = None  # /health/ready status afterwards
    alive_after: bool | None = None
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        def ms(v: float) -> str:
            return "-" if math.isnan(v) else f"{v * 1000:.0f}"

        head = (
            f"{'phase':<12} {'kind':<10} {'target/s':>8} {'offered/s':>9} {'accepted/s':>10} "
            f"{'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>7} {'refused p50/p99 ms':>18} "
            f"{'peak RSS MiB':>12}  statuses"
        )
        lines = [head, "-" * len(head)]
        for p in self.phases:
            target = "-" if p.target_rate is None else f"{p.target_rate:.1f}"
            rss = "-" if p.peak_rss_mib is None else f"{p.peak_rss_mib:.1f}"
            statuses = " ".join(f"{k}:{v}" for k, v in p.statuses.items())
            if p.skipped:
                statuses += f" unsent:{p.skipped}"
            if p.peak_open is not None:
                statuses += f" (open at most {p.peak_open})"
            refused = f"{ms(p.refused_p50_s)}/{ms(p.refused_p99_s)}"
            lines.append(
                f"{p.name:<12} {p.kind:<10} {target:>8} {p.offered_rate:>9.1f} {p.accepted_rate:>10.1f} "
                f"{ms(p.p50_s):>7} {ms(p.p95_s):>7} {ms(p.p99_s):>7} {ms(p.max_s):>7} {refused:>18} "
                f"{rss:>12}  {statuses}"
            )
        capacity = ", ".join(f"{k} {v:.1f}/s" for k, v in self.capacity.items())
        baseline = "-" if self.baseline_rss_mib is None else f"{self.baseline_rss_mib:.1f} MiB"
        lines += [
            "",
            f"capacity (closed loop, {self.items} input(s) per request): {capacity}; "
            f"overload factor {self.factor:g}",
            f"limits: MAX_QUEUE_SIZE {self.limits.max_queue_size}, QUEUE_TIMEOUT_S "
            f"{self.limits.queue_timeout_s:g}, admitted bound {self.limits.admitted_bound_s:g} s",
            f"RSS after warm-up {baseline}; overload peaks "
            + ", ".join("-" if v is None else f"{v:.1f}" for v in self.overload_peaks_mib)
            + " MiB",
            f"deepest queue seen: {self.max_queue_depth or '-'}; rejected queue_full: "
            f"{self.rejected_queue_full}; ready afterwards: {self.ready_after}; alive: {self.alive_after}",
        ]
        return "\n".join(lines)


def check(report: Report, records: Sequence[Record]) -> list[str]:
    """The contract's breaches, one line each (empty: it held). ``records``: every overload request."""
    limits = report.limits
    broken: list[str] = []
    if not records:
        return ["no overload request was sent"]

    def examples(bad: list[Record]) -> str:
        return "; ".join(
            f"{r.kind} {r.status or r.error} after {r.latency_s:.2f}s (type {r.error_type})" for r in bad[:3]
        )

    unanswered = [r for r in records if r.status == 0]
    if unanswered:
        broken.append(f"{len(unanswered)} requests got no HTTP answer: {examples(unanswered)}")
    server_errors = [r for r in records if r.status >= 500 and r.status != 503]
    if server_errors:
        broken.append(f"{len(server_errors)} answers were 5xx other than 503: {examples(server_errors)}")
    other = [r for r in records if r.status not in (0, 200, 429, 503) and r.status < 500]
    if other:
        broken.append(f"{len(other)} answers were neither 200, 429 nor 503: {examples(other)}")

    def retry_after_ok(r: Record) -> bool:
        return r.retry_after is not None and r.retry_after.isdigit() and int(r.retry_after) >= 1

    no_retry = [r for r in records if r.status in (429, 503) and not retry_after_ok(r)]
    if no_retry:
        broken.append(
            f"{len(no_retry)} refusals lack a Retry-After >= 1 (e.g. {no_retry[0].retry_after!r}): "
            + examples(no_retry)
        )
    if not any(r.status in (429, 503) for r in records):
        broken.append("nothing was refused: the offered load did not fill the queues, or they are unbounded")
    late = [r for r in records if r.status == 200 and r.latency_s > limits.admitted_bound_s]
    if late:
        broken.append(
            f"{len(late)} admitted requests took longer than QUEUE_TIMEOUT_S + compute bound "
            f"({limits.admitted_bound_s:g} s): {examples(late)}"
        )
    if not any(r.status == 200 for r in records):
        broken.append("no request was admitted during overload")
    unsent = sum(p.skipped for p in report.phases)
    if unsent:
        broken.append(
            f"{unsent} arrivals were not sent: the server held the client's cap of open requests, "
            "so requests queue without bound somewhere before the model queues"
        )
    deep = {m: d for m, d in report.max_queue_depth.items() if d > limits.max_queue_size}
    if deep:
        broken.append(f"queue depth exceeded MAX_QUEUE_SIZE {limits.max_queue_size}: {deep}")

    peaks = [p for p in report.overload_peaks_mib if p is not None]
    if report.baseline_rss_mib is not None and len(peaks) == len(report.overload_peaks_mib) >= 2:
        top = max(peaks)
        if top - report.baseline_rss_mib > limits.rss_growth_mib:
            broken.append(
                f"peak RSS {top:.1f} MiB is {top - report.baseline_rss_mib:.1f} MiB over the "
                f"{report.baseline_rss_mib:.1f} MiB after warm-up (bound {limits.rss_growth_mib:g} MiB)"
            )
        # Not climbing: the later half of the phases peaks no higher than the earlier half (plus slack).
        # Halves rather than phase 1 alone, so that allocator and arena growth finishing in phase 2
        # of a long soak is not taken for a leak, while a steady leak still shows.
        half = len(peaks) // 2
        earlier, later = max(peaks[:half]), max(peaks[half:])
        if later > earlier + limits.rss_phase_slack_mib:
            broken.append(
                f"RSS climbs across phases: phases {half + 1}-{len(peaks)} peaked at {later:.1f} MiB, "
                f"phases 1-{half} at {earlier:.1f} MiB (slack {limits.rss_phase_slack_mib:g} MiB)"
            )
    if report.alive_after is False:
        broken.append("the service process died")
    if report.ready_after != 200:
        broken.append(f"/health/ready answered {report.ready_after} after the overload, not 200")
    if not report.rejected_queue_full:
        broken.append(
            f'/metrics counts {report.rejected_queue_full} tserve_requests_rejected_total{{reason="queue_full"}}'
        )
    return broken


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
