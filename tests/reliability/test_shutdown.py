"""Graceful shutdown of a real `python -m service` process under traffic: SIGTERM (and SIGHUP) loses no request.

Requests are held in flight deterministically: batched ones wait out a long
MAX_QUEUE_DELAY_MS, and streams queue behind each other with
MAX_RUNNING_SEQUENCES=1, so when the first stream has its first token the
others have not started. The test waits for that and for the server's own
in-flight gauge to show the batched requests, sends SIGTERM, and checks that

- readiness turns 503 ("draining") while liveness stays 200,
- a new request gets 503 with Retry-After,
- every request that was in flight completes with 200 (streams with their `done` event),
- the process exits 0.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import ServiceProcess, metric

from harness.ports import free_port

BATCHED = 6
STREAMS = 4


def in_flight(url: str) -> float:
    return metric(url, "tserve_http_requests_in_flight", exclude={"route": "/metrics"})


def stream(url: str, prompt: str, first_token: threading.Event) -> dict[str, Any]:
    body = {"prompt": prompt, "max_new_tokens": 200, "temperature": 0, "stream": True}
    events = []
    with (
        httpx.Client(base_url=url, timeout=120) as client,
        client.stream("POST", "/v1/generate", json=body) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(("event:", "data:")):
                events.append(line)
                first_token.set()
    assert events[-2] == "event: done", events[-4:]
    return json.loads(events[-1][len("data:") :])


@pytest.mark.parametrize(
    ("workers", "sig"),
    [(1, signal.SIGTERM), (2, signal.SIGTERM), (1, signal.SIGHUP)],
    ids=["1-SIGTERM", "2-SIGTERM", "1-SIGHUP"],
)
def test_sigterm_drains_in_flight_requests_and_exits_0(
    tiny_models: Path, tmp_path: Path, workers: int, sig: signal.Signals
) -> None:
    """SIGHUP (a closed terminal, a careless `kill -HUP`) once ended a one-worker service at once, cutting
    every stream; it drains as SIGTERM does."""
    env = {
        "MODEL_REPOSITORY": str(tiny_models),
        "WORKERS": str(workers),
        # every batched request waits 8 s for company: on a loaded machine the waits below (for the requests
        # and the first token) took most of 4 s, and the drain ended before the probes saw it (refused)
        "MAX_QUEUE_DELAY_MS": "8000",
        "MAX_BATCH_SIZE": "64",
        "MAX_RUNNING_SEQUENCES": "1",  # streams decode one after another
        "SHUTDOWN_TIMEOUT_S": "60",
        "CACHE_ENABLED": "false",
        "INTRA_OP_THREADS": "1",
    }
    service = ServiceProcess(free_port(), env, tmp_path / "service.log").start()
    try:
        with ThreadPoolExecutor(BATCHED + STREAMS) as pool:
            pending: list[Future[Any]] = [
                pool.submit(httpx.post, f"{service.url}/v1/classify", json={"text": f"film {i}"}, timeout=120)
                for i in range(BATCHED)
            ]
            first_token = threading.Event()
            pending += [pool.submit(stream, service.url, f"KING {i}:", first_token) for i in range(STREAMS)]
            deadline = time.monotonic() + 30
            while in_flight(service.url) < BATCHED and time.monotonic() < deadline:
                time.sleep(0.05)
            # (With two workers the gauge is summed over both: prometheus_client's multiprocess mode.)
            assert in_flight(service.url) >= BATCHED
            assert first_token.wait(30)

            assert service.proc is not None
            service.proc.send_signal(sig)

            # every worker draining: each new connection may reach either, so several 503s in a row
            draining, deadline = 0, time.monotonic() + 10
            while draining < 5 and time.monotonic() < deadline:
                ready = httpx.get(f"{service.url}/health/ready", timeout=10)
                draining = draining + 1 if ready.status_code == 503 else 0
                time.sleep(0.05)
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert httpx.get(f"{service.url}/health/live", timeout=10).status_code == 200
            late = httpx.post(f"{service.url}/v1/classify", json={"text": "too late"}, timeout=10)
            assert late.status_code == 503 and int(late.headers["retry-after"]) >= 1
            assert late.json()["error"]["type"] == "not_ready"

            results = [f.result(timeout=120) for f in pending]
        for response in results[:BATCHED]:
            assert response.status_code == 200, response.text
            assert response.json()["results"][0]["label"]
        for done in results[BATCHED:]:
            assert done["finish_reason"] in ("length", "eos", "stop") and done["usage"]["output_tokens"] > 0
        assert service.proc.wait(timeout=90) == 0, service.log()[-3000:]
        # Each process logs how many requests it was still answering when the drain began.
        counts = [int(n) for n in re.findall(r"draining: .*?(\d+) request\(s\) in flight", service.log())]
        assert len(counts) == workers and sum(counts) >= 1, counts
        # uvloop and httptools are what serve (uvicorn silently falls back to asyncio and h11 without them),
        # httptools with the header deadline (service/http_server.py).
        served_with = re.findall(r"serving with event loop (\S+), HTTP protocol (\S+)", service.log())
        assert served_with and set(served_with) == {("uvloop.Loop", "HttpToolsWithDeadline")}, served_with
        # Each process's ONNX Runtime sessions share one thread pool (ORT_THREAD_POOL=shared, the default).
        shared = re.findall(r"ONNX Runtime sessions share one thread pool", service.log())
        assert len(shared) == workers, service.log()[-3000:]
    finally:
        service.stop()
