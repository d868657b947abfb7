"""``X-Request-Priority`` and ``X-Request-Timeout-Ms``: any HTTP request's priority class and deadline, for
every door (a body's own ``priority`` or ``timeout`` field, where its door has one, comes on top:
``inference/scheduling.py``). A malformed header, or one sent twice, is a 422 ``validation_error`` naming
it (as the body's fields are), before the body is read. A key's ceiling (``service/access/keys.py``) still
applies: a tenant's request is never served above its key's ``max_priority``."""

from __future__ import annotations

from collections.abc import Callable

from litestar.types import ASGIApp, Receive, Scope, Send

from service.api.http.meta import meta_of, set_meta
from service.api.http.raw_errors import send_error
from service.errors import InvalidInputError, problem_of
from service.inference.scheduling import header_integer, priority_named, timeout_of

PRIORITY = b"x-request-priority"
TIMEOUT_MS = b"x-request-timeout-ms"


def _header(scope: Scope, name: bytes, field: str) -> str | None:
    """The header's one value (None: absent); sent more than once it is refused, since which one a proxy
    or a client meant cannot be told."""
    values = [v for k, v in scope["headers"] if k.lower() == name]
    if len(values) > 1:
        raise InvalidInputError(f"was sent {len(values)} times; send it once", field, "repeated_header")
    return values[0].decode("latin-1") if values else None


def _scheduling(scope: Scope) -> tuple[bool, int | None, float | None]:
    """Whether the request sets either header, and the class and the timeout (seconds) they ask for."""
    priority_text = _header(scope, PRIORITY, "X-Request-Priority")
    timeout_text = _header(scope, TIMEOUT_MS, "X-Request-Timeout-Ms")
    if priority_text is None and timeout_text is None:
        return False, None, None
    priority = None if priority_text is None else priority_named(priority_text, "X-Request-Priority")
    timeout_s = None
    if timeout_text is not None:
        milliseconds = header_integer(timeout_text, "X-Request-Timeout-Ms")
        timeout_s = timeout_of(milliseconds, "X-Request-Timeout-Ms", 1e-3)
    return True, priority, timeout_s


def schedule_requests() -> Callable[[ASGIApp], ASGIApp]:
    def middleware_factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            try:
                asked, priority, timeout_s = _scheduling(scope)
            except InvalidInputError as exc:
                await send_error(scope, send, problem_of(exc))
                return
            if not asked:
                await app(scope, receive, send)
                return
            set_meta(scope, meta_of(scope).scheduled(priority, timeout_s))
            await app(scope, receive, send)

        return middleware

    return middleware_factory
