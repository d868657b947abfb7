"""The overload run's traffic and sampling: what is offered, how it is sent, what is measured.

``overload.py`` (the command) calls these in order: :func:`closed_loop` to measure capacity,
:func:`open_loop` to offer a multiple of it, while :class:`RssSampler` reads the server's VmRSS and
:class:`MetricsPoller` its queue depths. ``overload_report.py`` turns the :class:`Record` list into
phase summaries and checks the contract.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.http_client import HTTPClient

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
    except TimeoutError:
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
                except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError):
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
