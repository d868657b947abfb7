"""Admission at the HTTP edge: a request's body arrives whole, in time and within its size, before the request
counts against MAX_IN_FLIGHT_REQUESTS.

A request that is still sending its body holds no slot: a thousand clients trickling a byte at a time
cannot lock the inference routes out (they would, counted from their headers). Each body has
BODY_READ_TIMEOUT_S to arrive (a 408 then, and the connection closed) and MAX_BODY_BYTES to fit in:
a declared ``Content-Length`` over it is refused before a byte is read, a chunked body as soon as it
passes it (413 either way), so an oversized body is never held in memory whole.

The body read here is handed to the app as one ``http.request`` message; everything ``receive``
gives after it (``http.disconnect``) comes from the server as before. Requests without a body (no
``Content-Length``, no ``Transfer-Encoding``) pass without a read. Probes and scrapes are answered
whatever the load: they are how operators see it.

This runs inside the API-key check (``auth.py``), so a request without a valid key is refused before
its body is read, and inside ``observe.py``, so every answer here has its request id, metrics and
access-log line.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from service.api.http.fast_lane import FastLane
from service.api.http.meta import meta_of
from service.api.http.raw_errors import send_error
from service.errors import Problem
from service.inference import scheduling
from service.lifecycle import Lifecycle
from service.observe import spans
from service.observe.loop_lag import LoopLag

# Probes and scrapes are answered whatever the load: they are how operators see it.
ALWAYS_ANSWERED = ("/health/", "/metrics", "/v2/health/")


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


def _declared_length(scope: Scope) -> tuple[int | None, bool]:
    """(Content-Length, whether a body comes at all) from the request's headers."""
    length: int | None = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked or bool(length)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        body: bytes = message.get("body", b"")  # type: ignore[assignment]
        size += len(body)
        if size > limit:
            raise _TooLarge
        chunks.append(body)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _read_body_within(receive: Receive, limit: int, timeout_s: float) -> bytes:
    async with asyncio.timeout(timeout_s):
        return await _read_body(receive, limit)


class Shedding:
    """Low-priority requests refused at the edge while the event loop lags: the cheapest answer the
    service has, before routing, parsing or validation, so that the loop's time goes to the work it
    admitted (as Google's SRE book sheds by criticality). The class is the one known before the body
    is parsed: ``X-Request-Priority`` or the key's default (a body's own ``priority`` orders the queue
    only). ``lag_s`` 0: off."""

    def __init__(
        self,
        lag: LoopLag,
        lag_s: float,
        on_shed: Callable[[], None] = lambda: None,
        depth_limit: int = 0,
    ) -> None:
        self.lag = lag
        self.lag_s = lag_s
        self.on_shed = on_shed
        # In a front end of the split service: the engine's high- and normal-priority work waiting, as it
        # last published it (set once the front end is connected), and the figure over which low priority
        # is shed by it (SHED_QUEUE_DEPTH; 0: never)
        self.urgent_waiting: Callable[[], int] | None = None
        self.depth_limit = depth_limit

    def _queue_over(self) -> bool:
        return bool(
            self.depth_limit and self.urgent_waiting is not None and self.urgent_waiting() >= self.depth_limit
        )

    def refuses(self, priority: int) -> bool:
        """Whether a request of class ``priority`` (the one its headers and key gave it) is shed now."""
        if priority < scheduling.LOW:
            return False
        return 0 < self.lag_s < self.lag.lag_s or self._queue_over()

    def refusal(self) -> Problem:
        """The answer to a request ``refuses`` turned away, counted."""
        self.on_shed()
        if 0 < self.lag_s < self.lag.lag_s:
            lag_ms = self.lag.lag_s * 1000
            why = f"its event loop runs {lag_ms:.0f} ms late, over SHED_LAG_MS {self.lag_s * 1000:g}"
        else:
            why = f"its engine has more urgent work waiting than SHED_QUEUE_DEPTH ({self.depth_limit})"
        return Problem(
            "shed",
            f"the service is busy ({why}) and the request is low priority; retry later",
            retry_after_s=1,
        )


def admit_requests(
    lifecycle: Lifecycle,
    max_in_flight: int,
    max_body_bytes: int,
    body_timeout_s: float,
    shedding: Shedding | None = None,
    lane: FastLane | None = None,
) -> Callable[[ASGIApp], ASGIApp]:
    """``lane``: the JSON routes' fast lane (``fast_lane.py``), which answers what it can of an admitted
    request with its body in hand; the app answers the rest."""

    async def admit(scope: Scope, receive: Receive, send: Send) -> tuple[Receive, bytes] | None:
        """The app's ``receive`` once the request is admitted, and its body; ``None`` once it was answered
        (or its client left) here."""
        read = await read_whole_body(scope, receive, send, max_body_bytes, body_timeout_s)
        if read is None:
            return None
        inner_receive, body = read
        route = scope.get("path_template") or "unmatched"
        if (
            shedding is not None
            and not route.startswith(ALWAYS_ANSWERED)
            and shedding.refuses(meta_of(scope).scheduling.priority)
        ):
            await send_error(scope, send, shedding.refusal())
            return None
        if lifecycle.in_flight >= max_in_flight and not route.startswith(ALWAYS_ANSWERED):
            message = f"the server is answering {lifecycle.in_flight} requests (MAX_IN_FLIGHT_REQUESTS); retry later"
            await send_error(scope, send, Problem("overloaded", message, retry_after_s=1))
            return None
        return inner_receive, body

    def middleware_factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            with spans.span("admission") as admission:
                admitted = await admit(scope, receive, send)
                if admission is not None:
                    admission.set_attribute("inference.admitted", admitted is not None)
            if admitted is None:
                return
            inner_receive, body = admitted
            lifecycle.request_started()
            try:
                if lane is None or not await lane.serve(scope, body, inner_receive, send):
                    await app(scope, inner_receive, send)
            finally:
                lifecycle.request_finished()

        return middleware

    return middleware_factory


async def read_whole_body(
    scope: Scope, receive: Receive, send: Send, max_body_bytes: int, body_timeout_s: float
) -> tuple[Receive, bytes] | None:
    """The request's body read whole, within MAX_BODY_BYTES and BODY_READ_TIMEOUT_S, and a ``receive`` that
    gives it again; ``None`` once the request was answered here (413, 408) or its client left. Also the way
    the key check finds a key a protocol sends in its body (``body_key.py``)."""
    length, has_body = _declared_length(scope)
    if length is not None and length > max_body_bytes:
        await _refuse(scope, send, "payload_too_large", _too_large(max_body_bytes))
        return None
    if not has_body:
        return receive, b""
    try:
        body = await _read_body_within(receive, max_body_bytes, body_timeout_s)
    except _Disconnected:
        return None  # nobody to answer
    except _TooLarge:
        await _refuse(scope, send, "payload_too_large", _too_large(max_body_bytes))
        return None
    except TimeoutError:
        await _refuse(
            scope,
            send,
            "request_timeout",
            f"the request body did not arrive within {body_timeout_s:g} s (BODY_READ_TIMEOUT_S)",
        )
        return None
    return _replay(body, receive), body


def _too_large(limit: int) -> str:
    return f"the request body is over {limit} bytes (MAX_BODY_BYTES)"


async def _refuse(scope: Scope, send: Send, kind: str, message: str) -> None:
    """An answer to a request whose body was not (or not all) read: the connection closes after it, since
    what is left of the body would otherwise be read as the next request."""
    await send_error(scope, send, Problem(kind, message, headers=(("Connection", "close"),)))


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the whole body once, then whatever the server sends (``http.disconnect``)."""
    pending: list[ReceiveMessage] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> ReceiveMessage:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
