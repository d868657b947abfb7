"""Real servers for the tests: the app in uvicorn on a loopback port (in-thread or as its own process)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from harness import service_process
from service.app import create_app
from service.http_server import uvicorn_config
from service.settings import Settings


def metric(url: str, name: str, exclude: dict[str, str] | None = None, **labels: str) -> float:
    """Sum of the samples called ``name`` on ``url``/metrics whose labels include ``labels``
    (and match none of ``exclude``)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
        and all(s.labels.get(k) == v for k, v in labels.items())
        and not any(s.labels.get(k) == v for k, v in (exclude or {}).items())
    )


class LiveServer:
    """uvicorn in a background thread on a free loopback port, with the app object at hand."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        config = uvicorn_config(
            self.app, settings, host="127.0.0.1", port=0, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="api-test-server", daemon=True)
        self.url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 300
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the API server did not start (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError("the API server did not start within 300 s")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.loop = self.server.servers[0].get_loop()  # the server's event loop, for ``on_loop``
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def pipeline(self, name: str) -> Any:
        return self.app.state.inference.registry.pipelines[name]

    def on_loop(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the server's event loop; its future (``.result()`` waits)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def occupy(self, name: str, seconds: float) -> Any:
        """Keep model ``name``'s compute thread busy for ``seconds``: what it queues meanwhile waits."""
        pipeline = self.pipeline(name)
        worker = getattr(pipeline, "engine", None) or pipeline.batcher  # generation, or a batched model
        return self.on_loop(worker.in_compute_thread(time.sleep, seconds))

    @contextlib.contextmanager
    def held(self, name: str) -> Iterator[Held]:
        """Model ``name``'s compute thread held for the block (60 s at most), with each entry that reaches
        its batcher's queue and each batch the batcher takes counted as they happen: a test waits on those
        events instead of guessing how long a loaded machine takes to send a request."""
        batcher = self.pipeline(name).batcher
        held = Held()
        queue, take = batcher._queue, batcher._take_batch
        append = queue.append

        def counted_append(entry: Any) -> None:
            append(entry)
            held.queued.release()

        def counted_take() -> Any:
            batch = take()
            if batch:
                held.taken.release()
            return batch

        queue.append, batcher._take_batch = counted_append, counted_take
        release = threading.Event()
        busy = self.on_loop(batcher.in_compute_thread(release.wait, 60))
        try:
            yield held
        finally:
            release.set()
            busy.result(timeout=30)
            queue.append, batcher._take_batch = append, take

    @contextlib.contextmanager
    def one_taken(self, name: str, headers: dict[str, str] | None = None) -> Iterator[None]:
        """Within the block, model ``name``'s batcher holds one request it took, waiting for the held
        compute thread: a request sent meanwhile waits in the queue. The thread is let go once the queue
        is empty (30 s at most): what was sent in the block has expired or left by then, or is computed."""
        with self.held(name) as held:
            filler = threading.Thread(
                target=lambda: httpx.post(
                    f"{self.url}/v1/classify", json={"text": "taken"}, headers=headers or {}, timeout=60
                )
            )
            filler.start()
            assert held.taken.acquire(timeout=30), "the filler request was never taken into a batch"
            yield
            batcher = self.pipeline(name).batcher
            deadline = (
                time.monotonic() + 30
            )  # what the block sent has expired or left before the thread is free
            while batcher.waiting and time.monotonic() < deadline:
                time.sleep(0.02)
        filler.join(timeout=60)


class Held:
    """What ``LiveServer.held`` counts: entries queued and batches taken, one release each."""

    def __init__(self) -> None:
        self.queued = threading.Semaphore(0)
        self.taken = threading.Semaphore(0)


class ServiceProcess(service_process.ServiceProcess):
    """``python -m service`` as a child process on ``port``: for signals, restarts and crashes.

    Stopping kills it and every process it started (uvicorn workers) at once, whatever state a test
    left it in: there is no drain to wait for.
    """

    def __init__(self, port: int, env: dict[str, str], log_path: Path) -> None:
        super().__init__(env, port=port, log_path=log_path, stop_grace_s=0)


def small_queues(models: Path, **overrides: Any) -> Settings:
    """Settings whose queues fill at once: a queue of one, batches of one without waiting, and no response
    cache (identical requests must all reach the queue)."""
    values: dict[str, Any] = {
        "MODEL_REPOSITORY": models,
        "MAX_QUEUE_SIZE": 1,
        "MAX_ITEMS": 1,
        "MAX_BATCH_SIZE": 1,
        "MAX_QUEUE_DELAY_MS": 0,
        "CACHE_ENABLED": False,
    }
    return Settings(**{**values, **overrides})


def burst_until_refused(client: httpx.Client, path: str, body: Any, bursts: int = 3) -> list[httpx.Response]:
    """Up to ``bursts`` bursts of 24 concurrent POSTs, until some are refused: those (429s), every other
    answer having been a 200."""
    full: list[httpx.Response] = []
    for _burst in range(bursts):
        with ThreadPoolExecutor(24) as pool:
            responses = list(pool.map(lambda _: client.post(path, json=body), range(24)))
        assert {r.status_code for r in responses} <= {200, 429}
        full = [r for r in responses if r.status_code == 429]
        if full:
            break
    assert full, f"no request to {path} was turned away by a queue of one"
    for r in full:
        assert int(r.headers["retry-after"]) >= 1
    return full


def hang_up_after_first_event(url: str, path: str, body: Any) -> None:
    """POST a streamed request on a connection of its own and close it once the first event arrives."""
    with httpx.Client(base_url=url, timeout=120) as client, client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # one event seen: hang up (leaving the block closes the connection)
