"""The split service's process tree (``FRONTENDS`` >= 1): one engine process, N front ends, one supervisor.

``python -m service`` (this module's ``run_split``) is the supervisor. It makes a private folder for the
sockets, starts the engine process (``python -m service.engine_host``), and then the front ends:
uvicorn's worker processes on the one HTTP socket it binds, each also serving gRPC on ``GRPC_PORT``
(gRPC's ``SO_REUSEPORT``, on by default on Linux, shares the port). Every process writes its metrics to
one ``PROMETHEUS_MULTIPROC_DIR``, so any front end's ``/metrics`` covers them all.

- An engine that dies is started again (a new one is a new epoch: front ends fail what waited on the
  old one with 503 and Retry-After, are not ready meanwhile, and serve again once it has loaded).
- A front end that dies is started again by uvicorn's supervisor; the engine cancels its sequences.
- SIGTERM: the front ends drain first (each as one process does: readiness 503, requests in flight
  finish within SHUTDOWN_TIMEOUT_S), then the engine is stopped, letting its work finish, then the
  supervisor exits.
- Every child dies with its parent (``PR_SET_PDEATHSIG``): none is left behind if the supervisor is
  killed.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from service.ipc.channel import ipc_folder
from service.lifecycle import run_workers
from service.process import PARENT_PID, die_with_parent

log = logging.getLogger("service.supervisor")

# Set in the front ends' environment: the folder of the engine's sockets (create_app serves as a front end).
ENGINE_IPC = "TSERVE_ENGINE_IPC"
RESTART_DELAY_S = 1.0
# How the engine process is started, its sockets' folder appended (benchmarks/fake_serve.py starts a
# fake engine's instead, for measuring the request path alone).
ENGINE_COMMAND = [sys.executable, "-m", "service.engine_host"]


class EngineProcess:
    """The engine process, started again whenever it dies until ``stop``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="engine-watch", daemon=True)
        self.restarts = 0

    def start(self) -> None:
        self._spawn()
        self._watcher.start()

    def _spawn(self) -> None:
        """Started from the watcher's thread on a restart: no ``preexec_fn`` (not safe with threads); the
        engine sets its own death signal first thing, checking that this process still lives."""
        command = [*ENGINE_COMMAND, str(self.folder)]
        self.proc = subprocess.Popen(command, env={**os.environ, PARENT_PID: str(os.getpid())})
        log.info("engine process %d started", self.proc.pid)

    def _watch(self) -> None:
        while not self._stopping.is_set():
            proc = self.proc
            if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                log.error("engine process %d exited with %s; starting another", proc.pid, proc.returncode)
                time.sleep(RESTART_DELAY_S)
                if not self._stopping.is_set():
                    self.restarts += 1
                    self._spawn()
            self._stopping.wait(0.2)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM (the engine lets its work finish), SIGKILL past ``timeout_s``."""
        self._stopping.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("engine process %d did not stop within %.0fs: killed", proc.pid, timeout_s)
            proc.kill()
            proc.wait()


def run_split(config: uvicorn.Config, frontends: int, shutdown_timeout_s: float) -> None:
    """The engine, then ``frontends`` front ends serving ``config``'s app until SIGTERM; then both, in order."""
    folder = ipc_folder()
    os.environ[ENGINE_IPC] = str(folder)  # the engine and the front ends inherit it
    engine = EngineProcess(folder)
    engine.start()
    try:
        config.workers = frontends
        run_workers(config)  # returns once every front end has drained and exited (SIGTERM)
    finally:
        engine.stop(shutdown_timeout_s + 5)
        shutil.rmtree(folder, ignore_errors=True)


def frontend_folder() -> Path | None:
    """In a front end of the split service: the folder of the engine's sockets; else None."""
    value = os.environ.get(ENGINE_IPC)
    return Path(value) if value else None


def started_as_frontend(**_: Any) -> None:
    """A front end dies with the supervisor that started it."""
    die_with_parent()
