"""The API-key check on the HTTP door: a middleware applying the key table of ``service/access/keys.py``
before the body is read (401 without a valid key), counting a keyed request against its quota and
running it at its key's priority (the request's metadata, ``meta.py``, carries the key, its prefix-cache salt,
its default class and its ceiling), with the ``RateLimit-*`` headers on its answer. The gRPC door applies
the same table in its interceptor (``api/grpc/auth.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service.access.keys import Admission, ApiKeys, admit_key, presented_key
from service.access.quotas import Quotas
from service.api.http.meta import meta_of, set_meta
from service.api.http.raw_errors import send_error
from service.errors import REFUNDED_STATUSES, Problem

# Where the auth middleware leaves an accepted request's cache scope (``cache_scope_of``).
CACHE_SCOPE_KEY = "cache_scope"


def cache_scope_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The response-cache scope the key check gave this request ("" without keys, or CACHE_SCOPE=shared)."""
    return str((connection.scope.get("state") or {}).get(CACHE_SCOPE_KEY, ""))


def _presented_key(scope: Scope) -> bytes:
    return presented_key(dict(scope["headers"]))


class _Answering:
    """``send`` for a keyed request: adds its admission's headers to the response's start, and notes the
    status sent."""

    def __init__(self, send: Send, admitted: Admission) -> None:
        self.send = send
        self.admitted = admitted
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = self.admitted.answer_headers()
            if headers:
                raw = [(k.lower().encode(), v.encode()) for k, v in headers]
                message = {**message, "headers": [*message.get("headers", []), *raw]}  # type: ignore[typeddict-item]
        await self.send(message)


def require_api_key(keys: ApiKeys, quotas: Quotas | None = None) -> Callable[[ASGIApp], ASGIApp]:
    def middleware_factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["type"] != "http"
                or not keys.enabled
                or keys.is_open(scope["path"])
                or scope.get("method") == "OPTIONS"  # CORS preflights carry no credentials
            ):
                await app(scope, receive, send)
                return
            presented = _presented_key(scope)
            entry = keys.identify(presented)
            if presented and (entry is not None or keys._plain(presented)):
                scope.setdefault("state", {})[CACHE_SCOPE_KEY] = keys.cache_scope(presented)  # type: ignore[typeddict-item]
                meta = meta_of(scope).keyed(entry, keys.prefix_salt(presented))
                if entry is None:
                    set_meta(scope, meta)
                    await app(scope, receive, send)
                    return
                problem, admitted = await admit_key(entry, quotas)
                if problem is not None:
                    await send_error(scope, send, problem)
                    return
                set_meta(scope, admitted.scheduled(meta))
                answering = _Answering(send, admitted)
                try:
                    await app(scope, receive, answering)
                finally:
                    await admitted.settle(quotas, answering.status in REFUNDED_STATUSES)
                return
            message = (
                "a valid API key is required: Authorization: Bearer KEY, or X-API-Key: KEY"
                if not presented
                else "the API key is not valid"
            )
            challenge = (("WWW-Authenticate", 'Bearer realm="tserve"'),)
            await send_error(
                scope, send, Problem("unauthorized", message, "Authorization", headers=challenge)
            )

        return middleware

    return middleware_factory
