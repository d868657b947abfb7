"""Real servers for the tests: the app in uvicorn on a loopback port (in-thread or as its own process)."""

from __future__ import annotations

import asyncio
import threading
import time
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
