"""Priorities and deadlines through the doors (service/engine/scheduling.py): a real server on loopback,
the model's compute thread kept busy on purpose (``LiveServer.occupy``) so that what arrives meanwhile
waits in its queue, in a known order. Completion order is asserted, never a duration."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from servers import LiveServer, metric
from tritonclient.utils import InferenceServerException

from harness.ports import free_port
from service.settings import Settings


@pytest.fixture(scope="module")
def server(tiny_models: Path) -> Iterator[LiveServer]:
    port = free_port()
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS=["bert-classifier", "gpt"],
        CACHE_ENABLED=False,
        MAX_BATCH_SIZE=1,
        MAX_RUNNING_SEQUENCES=1,
        GRPC_PORT=port,
    )
    with LiveServer(settings) as live:
        live.grpc_url = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield live


def _computed(server: LiveServer, model: str) -> float:
    """Items the model has computed so far (the sum of its batch sizes)."""
    return metric(server.url, "tserve_batch_size_sum", model=model)


def _in_order(server: LiveServer, requests: list[tuple[str, dict[str, Any], dict[str, str]]]) -> list[str]:
    """Send each (label, body, headers) to /v1/classify a moment apart, while the model is busy; the
    labels in the order their answers came back."""
    done: list[str] = []
    lock = threading.Lock()

    def send(label: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        r = httpx.post(f"{server.url}/v1/classify", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        with lock:
            done.append(label)

    batcher = server.pipeline("bert-classifier").batcher
    run_batch = batcher._run_batch

    def spaced(items: list[Any]) -> Any:  # the real model, then a pause: answers come back well apart
        out = run_batch(items)
        time.sleep(0.05)
        return out

    queue = batcher._queue
    append = queue.append
    queued = threading.Semaphore(0)

    def counted(entry: Any) -> None:  # each request's entry, as it enters the queue
        append(entry)
        queued.release()

    batcher._run_batch = spaced
    queue.append = counted
    try:
        # the compute thread is held until every request has queued (however slow a loaded machine is)
        release = threading.Event()
        busy = server.on_loop(batcher.in_compute_thread(release.wait, 60))
        threads = []
        try:
            for label, body, headers in requests:
                threads.append(threading.Thread(target=send, args=(label, body, headers)))
                threads[-1].start()
                assert queued.acquire(timeout=30), f"{label} never reached the queue"  # before the next
        finally:
            release.set()
        busy.result(timeout=30)
        for t in threads:
            t.join(timeout=60)
    finally:
        batcher._run_batch = run_batch
        queue.append = append
    return done


def test_an_urgent_request_overtakes_the_ones_queued_ahead_of_it(server: LiveServer) -> None:
    lows = [(f"low{i}", {"text": f"low {i}", "priority": "low"}, {}) for i in range(4)]
    high = ("high", {"text": "urgent"}, {"X-Request-Priority": "high"})  # the header's way
    normal = ("normal", {"text": "normal"}, {})
    order = _in_order(server, [*lows, normal, high])
    # low0 was taken before the others came (its batch waits for the busy thread); then the most
    # urgent first, whatever came before, and first in, first out within a class
    assert order == ["low0", "high", "normal", "low1", "low2", "low3"], order


def test_a_request_past_its_deadline_while_queued_is_a_504_and_never_computed(server: LiveServer) -> None:
    before = _computed(server, "bert-classifier")
    with server.one_taken("bert-classifier"):  # the batcher waits for it; what comes next waits in the queue
        r = httpx.post(f"{server.url}/v1/classify", json={"text": "late", "timeout_ms": 200}, timeout=60)
    assert r.status_code == 504 and r.json()["error"]["type"] == "deadline_exceeded"
    time.sleep(0.2)
    assert _computed(server, "bert-classifier") == before + 1  # the one taken; the late one never
    assert metric(server.url, "tserve_priority_expired_total", model="bert-classifier") >= 1
    header = httpx.post(
        f"{server.url}/v1/classify", json={"text": "x"}, headers={"X-Request-Timeout-Ms": "soon"}, timeout=30
    )
    assert header.status_code == 422 and header.json()["error"]["field"] == "X-Request-Timeout-Ms"


def test_a_grpc_call_with_a_client_timeout_is_removed_at_its_deadline(server: LiveServer) -> None:
    client = tgrpc.InferenceServerClient(server.grpc_url)  # type: ignore[attr-defined]
    text = tgrpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a call with a deadline"], dtype=object))
    before = _computed(server, "bert-classifier")
    with server.one_taken("bert-classifier"), pytest.raises(InferenceServerException) as caught:
        client.infer("bert-classifier", [text], client_timeout=0.2)
    assert "DEADLINE_EXCEEDED" in str(caught.value.status())
    time.sleep(0.5)
    assert _computed(server, "bert-classifier") == before + 1
    # the Open Inference Protocol's own parameter does the same over HTTP
    r = httpx.post(
        f"{server.url}/v2/models/bert-classifier/infer",
        json={
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
            "parameters": {"timeout": 100_000},  # µs
        },
        timeout=60,
    )
    assert r.status_code == 200  # the model is idle now: answered within its deadline
    client.close()


def test_a_generation_past_its_deadline_ends_with_finish_reason_deadline(server: LiveServer) -> None:
    """Each decoding step held 50 ms (the real step, then a pause): the request's 300 ms deadline passes a
    few tokens in, and the sequence ends at that step with what it has, its usage counted, instead of
    decoding to its length."""
    batch = server.pipeline("gpt").engine._batch
    step = batch.step

    def slow_step(*args: Any) -> Any:
        out = step(*args)
        time.sleep(0.05)
        return out

    batch.step = slow_step
    body = {"prompt": "KING:", "max_new_tokens": 60, "temperature": 0, "timeout_ms": 300, "stream": True}
    events: list[dict[str, Any]] = []
    try:
        with (
            httpx.Client(base_url=server.url, timeout=60) as client,
            client.stream("POST", "/v1/generate", json=body) as r,
        ):
            assert r.status_code == 200
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    finally:
        batch.step = step
    done = events[-1]
    assert done["finish_reason"] == "deadline", done
    assert 1 <= done["usage"]["output_tokens"] < 60
    assert done["text"] == "".join(e["text"] for e in events[:-1])


def test_a_client_that_hangs_up_while_its_request_waits_takes_it_out_of_the_queue(server: LiveServer) -> None:
    before = _computed(server, "bert-classifier")
    dropped = metric(server.url, "tserve_requests_dropped_total", model="bert-classifier")
    with server.one_taken("bert-classifier"), pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/classify", json={"text": "gone"}, timeout=0.3)  # waits, then hangs up
    time.sleep(0.3)
    assert _computed(server, "bert-classifier") == before + 1  # the one taken; the other left the queue
    assert metric(server.url, "tserve_requests_dropped_total", model="bert-classifier") == dropped + 1


def _classify(server: LiveServer, text: str, priority: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/classify", json={"text": text}, headers={"X-Request-Priority": priority}, timeout=30
    )


def test_while_the_event_loop_lags_low_priority_is_shed_at_the_edge_and_the_rest_is_served(
    server: LiveServer,
) -> None:
    """SHED_LAG_MS (5 ms by default): a loop kept busy 50 ms at a time runs its timers that late, so a
    request that says ``low`` in its header is refused before it is parsed; high and normal still get
    their answers. Once the loop is on time again, low is served too."""
    shed_before = metric(server.url, "tserve_requests_shed_total")
    stop = threading.Event()

    async def hog() -> None:
        while not stop.is_set():
            time.sleep(0.05)  # blocks the loop, as a burst of requests does
            await asyncio.sleep(0.005)

    hogging = server.on_loop(hog())
    try:
        time.sleep(0.3)
        low = _classify(server, "later", "low")
        high = _classify(server, "now", "high")
        normal = httpx.post(f"{server.url}/v1/classify", json={"text": "as usual"}, timeout=30)
    finally:
        stop.set()
        hogging.result(timeout=10)
    assert low.status_code == 429, low.text
    error = low.json()["error"]
    assert error["type"] == "shed" and "SHED_LAG_MS" in error["message"], error
    assert int(low.headers["Retry-After"]) >= 1
    assert high.status_code == 200 and normal.status_code == 200, (high.text, normal.text)
    assert metric(server.url, "tserve_requests_shed_total") == shed_before + 1
    assert metric(server.url, "tserve_event_loop_lag_seconds_count") > 0

    # the loop on time again (the lag halves every tick; a machine busy with other work takes longer)
    deadline = time.monotonic() + 30
    while True:
        time.sleep(0.5)
        again = _classify(server, "later", "low")
        if again.status_code == 200 or time.monotonic() > deadline:
            break
    assert again.status_code == 200, again.text


# --- malformed scheduling input is a 4xx naming its field, never a 500 --------------------------------


@pytest.mark.parametrize(
    "value",
    [b"--5", b"-5", b"\xb2", "\u0662".encode(), b"9" * 400, b"9" * 5000, b"1.5", b"0", b"", b"5 5"],
    ids=[
        "double-minus",
        "negative",
        "superscript-two",
        "arabic-digit",
        "400-digits",
        "5000-digits",
        "decimal",
        "zero",
        "empty",
        "two-numbers",
    ],
)
def test_a_malformed_timeout_header_is_a_422_naming_it_on_every_path(
    server: LiveServer, value: bytes
) -> None:
    headers = [(b"x-request-timeout-ms", value)]
    for method, path, body in (("POST", "/v1/classify", {"text": "x"}), ("GET", "/health/ready", None)):
        r = httpx.request(method, f"{server.url}{path}", json=body, headers=headers, timeout=30)
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        error = r.json()["error"]
        assert error["field"] == "X-Request-Timeout-Ms" and error["type"] == "validation_error", error


def test_a_scheduling_header_sent_twice_is_refused_naming_it(server: LiveServer) -> None:
    for name, values in (("X-Request-Priority", ("high", "low")), ("X-Request-Timeout-Ms", ("100", "200"))):
        headers = [(name, v) for v in values]
        r = httpx.post(f"{server.url}/v1/classify", json={"text": "x"}, headers=headers, timeout=30)
        assert r.status_code == 422 and r.json()["error"]["field"] == name, r.text
        assert "sent 2 times" in r.json()["error"]["message"]


@pytest.mark.parametrize("digits", [400, 4000])
def test_an_overlong_oip_timeout_is_a_4xx_naming_it_on_infer_and_generate(
    server: LiveServer, digits: int
) -> None:
    huge = int("9" * digits)
    infer = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
        "parameters": {"timeout": huge},
    }
    generate = {"text_input": "KING:", "parameters": {"max_tokens": 2, "timeout": huge}}
    for path, body in (("/v2/models/bert-classifier/infer", infer), ("/v2/models/gpt/generate", generate)):
        r = httpx.post(f"{server.url}{path}", content=json.dumps(body), timeout=30)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:300])
        assert "parameters.timeout" in r.text, r.text[:300]
