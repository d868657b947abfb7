"""``X-Request-Priority`` and ``X-Request-Timeout-Ms``: any HTTP request's priority class and deadline, for
every door (a body's own ``priority`` or ``timeout`` field, where its door has one, comes on top:
``inference/scheduling.py``). A malformed header is a 400 naming it, before the body is read."""

from __future__ import annotations

from collections.abc import Callable

from litestar.types import ASGIApp, Receive, Scope, Send

from service.api.http.raw_errors import send_error
from service.errors import InvalidInputError, problem_of
from service.inference.scheduling import priority_named, scheduled, timeout_of

PRIORITY = b"x-request-priority"
TIMEOUT_MS = b"x-request-timeout-ms"


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name), None)


def schedule_requests() -> Callable[[ASGIApp], ASGIApp]:
    def middleware_factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            priority_text, timeout_text = _header(scope, PRIORITY), _header(scope, TIMEOUT_MS)
            if priority_text is None and timeout_text is None:
                await app(scope, receive, send)
                return
            try:
                priority = (
                    None if priority_text is None else priority_named(priority_text, "X-Request-Priority")
                )
                timeout_s = None
                if timeout_text is not None:
                    digits = timeout_text.strip()
                    value: object = int(digits) if digits.lstrip("-").isdigit() else digits
                    timeout_s = timeout_of(value, "X-Request-Timeout-Ms", 1e-3)
            except InvalidInputError as exc:
                await send_error(scope, send, problem_of(exc))
                return
            with scheduled(priority, timeout_s):
                await app(scope, receive, send)

        return middleware

    return middleware_factory
