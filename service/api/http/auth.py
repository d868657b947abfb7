"""Optional API keys: with API_KEYS set, every request needs one of them, else 401.

A key travels as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. Keys are
compared in constant time (``hmac.compare_digest`` against every configured
key, no early exit), so response timing does not reveal how much of a guess
was right. Health probes and /metrics stay open unless AUTH_HEALTH /
AUTH_METRICS say otherwise (probes and scrapers rarely carry credentials);
the OpenAPI schema, docs and their assets stay open. The check runs before the body is read.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping, Sequence

from litestar.types import ASGIApp, Receive, Scope, Send

from service.api.http.raw_errors import send_error


class ApiKeys:
    def __init__(self, keys: Sequence[str], protect_health: bool, protect_metrics: bool) -> None:
        self._keys = [k.encode() for k in keys if k]
        self._open_prefixes = ["/schema", "/static/", "/playground"]  # pages and assets; they hold no data
        if not protect_health:
            self._open_prefixes += ["/health/", "/v2/health/"]
        if not protect_metrics:
            self._open_prefixes.append("/metrics")

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    @property
    def protects_health(self) -> bool:
        return "/health/" not in self._open_prefixes

    def is_open(self, path: str) -> bool:
        if path == "/":  # the redirect to the playground
            return True
        return any(path == p.rstrip("/") or path.startswith(p) for p in self._open_prefixes)

    def accepts(self, presented: bytes) -> bool:
        valid = False
        for key in self._keys:  # every key is compared, whichever matches
            valid |= hmac.compare_digest(presented, key)
        return valid


def presented_key(headers: Mapping[bytes, bytes]) -> bytes:
    """The key a request presents (lower-case header names): ``Authorization: Bearer KEY`` or ``X-API-Key``;
    the gRPC door reads its metadata with the same rule."""
    authorization = headers.get(b"authorization", b"")
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return headers.get(b"x-api-key", b"").strip()


def _presented_key(scope: Scope) -> bytes:
    return presented_key(dict(scope["headers"]))


def require_api_key(keys: ApiKeys) -> Callable[[ASGIApp], ASGIApp]:
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
            if presented and keys.accepts(presented):
                await app(scope, receive, send)
                return
            await send_error(
                scope,
                send,
                401,
                "unauthorized",
                "a valid API key is required: Authorization: Bearer KEY, or X-API-Key: KEY"
                if not presented
                else "the API key is not valid",
                field="Authorization",
                headers={"WWW-Authenticate": 'Bearer realm="tserve"'},
            )

        return middleware

    return middleware_factory
