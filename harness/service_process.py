"""``python -m service`` as a child process: started with its settings, awaited until ready, stopped, its log kept.

What the reliability tests, the benchmarks, the overload check and the load-test runner each launched
on their own before: a free loopback port, the settings as environment variables over this process's
own, the log (stdout and stderr) in a file, ``/health/ready`` polled until it answers 200, and a stop
that reaches uvicorn's workers too (the service runs in its own process group).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .ports import free_port
from .processes import die_with_parent, process_cpu_seconds, process_tree_cpu_seconds, stop_process_group

ROOT = Path(__file__).resolve().parents[1]
READY_POLL_S = 0.02  # fine enough for the cold-start benchmark, which times spawn -> ready


class ServiceNotReady(RuntimeError):
    """The service exited, or did not answer /health/ready with 200 in time (the message ends with its log)."""


class ServiceProcess:
    """``python -m service`` (or ``command``) on ``port`` (default: a free one) of 127.0.0.1.

    ``env``: settings over this process's environment (HOST and PORT are set here); a None value removes
    an inherited variable. ``log_path``: the log, appended to (default: a temporary file that ``close``
    removes). ``stop_grace_s``: how long ``stop`` waits after SIGTERM before SIGKILL (0: kill at once).
    ``die_with_parent``: SIGTERM the service if this process dies without stopping it. ``cpu_of_tree``:
    ``cpu_seconds`` counts every process the command started too (a server with worker processes).
    """

    def __init__(
        self,
        env: Mapping[str, str | None] | None = None,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        command: Sequence[str] | None = None,
        stop_grace_s: float = 20.0,
        die_with_parent: bool = False,
        cpu_of_tree: bool = False,
        ready_path: str = "/health/ready",
    ) -> None:
        self.port = port or free_port()
        self.ready_path = ready_path  # a peer server's own (Triton's /v2/health/ready)
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = list(command or [sys.executable, "-m", "service"])
        settings = {
            **os.environ,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "ORT_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.env = {k: v for k, v in settings.items() if v is not None}
        self._temporary_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="service-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = log_path
        self.stop_grace_s = stop_grace_s
        self.die_with_parent = die_with_parent
        self.cpu_of_tree = cpu_of_tree
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s = math.nan  # spawn -> /health/ready 200

    def start(self, ready_timeout_s: float = 300.0) -> ServiceProcess:
        """Spawn it and wait until /health/ready answers 200; ServiceNotReady (it is stopped) otherwise."""
        spawned_at = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches the workers too
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        deadline = spawned_at + ready_timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise ServiceNotReady(
                    f"the service exited with {self.proc.returncode}; the end of {self.log_path}:\n{self.log_tail()}"
                )
            if self.get_status(self.ready_path) == 200:
                self.ready_s = time.perf_counter() - spawned_at
                return self
            time.sleep(READY_POLL_S)
        self.stop(grace_s=0)
        raise ServiceNotReady(
            f"the service was not ready within {ready_timeout_s:g} s; the end of {self.log_path}:\n{self.log_tail()}"
        )

    def get_status(self, path: str) -> int | None:
        """The status of GET ``path``, or None when no answer comes (not listening yet, gone)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        except (OSError, http.client.HTTPException):  # HTTPException: not (yet) an HTTP server there
            return None
        finally:
            conn.close()

    def get_text(self, path: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def get_json(self, path: str) -> Any:
        return json.loads(self.get_text(path))

    def cpu_seconds(self) -> float:
        """CPU time the service's main process (or its whole tree) has used so far (NaN once it is gone)."""
        if self.proc is None:
            return math.nan
        return (process_tree_cpu_seconds if self.cpu_of_tree else process_cpu_seconds)(self.proc.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def stop(self, grace_s: float | None = None) -> bool:
        """SIGTERM the service and its workers, SIGKILL after ``grace_s`` (default ``stop_grace_s``).

        Returns False when it had to kill. The log stays until ``close``.
        """
        stopped = stop_process_group(self.proc, self.stop_grace_s if grace_s is None else grace_s)
        self.proc = None
        return stopped

    def close(self) -> None:
        """Stop it and remove a temporary log."""
        self.stop()
        if self._temporary_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> ServiceProcess:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *_: object) -> None:
        self.close()
