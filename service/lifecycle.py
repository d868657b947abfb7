"""Graceful shutdown: on SIGTERM, drain first (readiness 503, new requests 503 + Retry-After), then exit.

``Lifecycle`` belongs to one app: the request middleware counts the HTTP
requests in flight (streams until their last event), and ``begin_drain``
flips the inference service to "draining". ``GracefulServer`` is uvicorn's
server with a different first reaction to SIGTERM / SIGINT: instead of
closing the listening socket at once, it drains while still answering (so
a load balancer that probes readiness moves away, and a client that arrives
late gets a clean 503 with Retry-After rather than a refused connection),
waits until no request is in flight or SHUTDOWN_TIMEOUT_S has passed, and
only then runs uvicorn's own shutdown: close the socket, finish the
connections, run the lifespan shutdown (engines stop), exit 0. A second
signal shuts down at once. SIGHUP is SIGTERM here: a one-process service drains on it rather than
dying at once (its default). Under WORKERS > 1 the supervisor's SIGHUP is uvicorn's rolling restart:
each worker in turn gets a replacement, and once that one is up the old one drains as on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Generator
from typing import Any

import uvicorn
import uvicorn.supervisors.multiprocess as uvicorn_multiprocess
from litestar import Litestar
from litestar.datastructures import State

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, state: State, shutdown_timeout_s: float) -> None:
        self._state = state
        self.shutdown_timeout_s = shutdown_timeout_s
        self.in_flight = 0
        self.draining = False

    def request_started(self) -> None:
        self.in_flight += 1

    def request_finished(self) -> None:
        self.in_flight -= 1

    def begin_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        inference = self._state.get("inference")  # absent while the models load: the lifespan drains it then
        if inference is not None:
            inference.drain()
        log.info(
            "draining: readiness is 503, new requests get 503; %d request(s) in flight get up to %.0fs",
            self.in_flight,
            self.shutdown_timeout_s,
        )


def lifecycle_of(app: Any) -> Lifecycle | None:
    """The Lifecycle of the Litestar app inside uvicorn's middleware wrappers, if any."""
    while app is not None and not isinstance(app, Litestar):
        app = getattr(app, "app", None)
    return getattr(app.state, "lifecycle", None) if app is not None else None


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that drains the app before its usual shutdown (module docstring)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._drain_since: float | None = None

    async def startup(self, sockets: Any = None) -> None:
        # What really serves: uvicorn picks uvloop and httptools when they import, else asyncio and h11.
        loop = type(asyncio.get_running_loop())
        protocol = getattr(self.config, "http_protocol_class", None)
        log.info(
            "serving with event loop %s.%s, HTTP protocol %s",
            loop.__module__,
            loop.__qualname__,
            getattr(protocol, "__name__", protocol),
        )
        await super().startup(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's SIGINT and SIGTERM, and SIGHUP as SIGTERM: a hang-up drains, it does not cut streams."""
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGHUP"):
            with super().capture_signals():
                yield
            return
        previous = signal.signal(signal.SIGHUP, self.handle_exit)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Runs as a signal handler: only note the time; on_tick (on the event loop) does the work.
        if self._drain_since is None and not self.should_exit:
            self._drain_since = time.monotonic()
            return
        self.should_exit = True
        self.force_exit = True  # a second signal: no more waiting

    async def on_tick(self, counter: int) -> bool:
        if self._drain_since is not None and not self.should_exit:
            lifecycle = lifecycle_of(self.config.loaded_app)
            if lifecycle is None:
                self.should_exit = True
            else:
                lifecycle.begin_drain()
                waited = time.monotonic() - self._drain_since
                if lifecycle.in_flight == 0 or waited >= lifecycle.shutdown_timeout_s:
                    if lifecycle.in_flight:
                        log.warning(
                            "drain deadline reached with %d request(s) in flight", lifecycle.in_flight
                        )
                    # What is left of the deadline bounds uvicorn's own wait for connections to close.
                    left = lifecycle.shutdown_timeout_s - waited
                    self.config.timeout_graceful_shutdown = max(1, int(left + 0.999))
                    self.should_exit = True
        return await super().on_tick(counter)


class GracefulWorker(uvicorn_multiprocess.Process):
    """A uvicorn worker process whose server is a GracefulServer (pickled by reference into the child)."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = GracefulServer(config=self.config)
        return self._server


def run_workers(config: uvicorn.Config) -> None:
    """uvicorn's multi-process supervisor, each worker draining on SIGTERM like a single process does.

    The supervisor builds its workers from the module-level name ``Process``; pointing that name at
    GracefulWorker (in this, the parent, process only) is the one seam uvicorn offers for it.
    """
    uvicorn_multiprocess.Process = GracefulWorker  # type: ignore[misc]
    uvicorn_multiprocess.Multiprocess(config, sockets=[config.bind_socket()]).run()
