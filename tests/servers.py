"""Real servers for the tests: the app in uvicorn on a loopback port (in-thread or as its own process)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


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
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
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
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def pipeline(self, name: str) -> Any:
        return self.app.state.inference.registry.pipelines[name]


class ServiceProcess:
    """``python -m service`` as a child process on a free port: for signals, restarts and crashes."""

    def __init__(self, port: int, env: dict[str, str], log_path: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "ORT_DISABLE_TELEMETRY": "1", **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float = 300) -> ServiceProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches the workers too
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the service was not ready within {ready_timeout_s}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """Kill the service and every process it started (uvicorn workers), whatever state it is in."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()
