"""Request ids: taken from the client's X-Request-ID when sane, else made up; echoed on every response.

The same rule (``client_request_id``) makes the gRPC door's ids.

Error bodies carry it too, so a client's bug report points at one log line.
"""

from __future__ import annotations

import os
import re
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders
from litestar.types import Message, Scope

HEADER = "x-request-id"
STATE_KEY = "request_id"
_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def client_request_id(given: str) -> str:
    """The one rule for an id a client sets, on every door (HTTP's X-Request-ID, gRPC's request ``id``):
    kept when it is 1-128 characters of ``A-Za-z0-9._:-``, else replaced by a new one. What reaches the
    logs and the error bodies is always this id; a protocol that echoes the client's own ``id`` field
    (the Open Inference Protocol) still echoes it as sent."""
    return given if _SANE.match(given) else new_request_id()


def new_request_id() -> str:
    """32 random hex digits, a ``uuid4().hex``'s form without building a UUID object on every request."""
    return os.urandom(16).hex()


def request_id_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    state = connection.scope.get("state") or {}
    value = state.get(STATE_KEY)
    return str(value) if value is not None else None


_HEADER_BYTES = HEADER.encode()


def assign_request_id(scope: Scope) -> str:
    """The client's X-Request-ID when sane, else a new one; kept in the scope's state for handlers and logs.

    Called by the request middleware (``service.api.http.observe``), first thing for every routed request.
    """
    given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _HEADER_BYTES), "")
    rid = client_request_id(given)
    scope.setdefault("state", {})[STATE_KEY] = rid  # type: ignore[typeddict-item]
    return rid


def with_request_id(message: Any, rid: str) -> None:
    """Add the X-Request-ID header to a response start message."""
    message["headers"] = [*message.get("headers", []), (_HEADER_BYTES, rid.encode())]


async def ensure_request_id_header(message: Message, scope: Scope) -> None:
    """A ``before_send`` hook: answers that no route produced (404, 405) get an X-Request-ID too."""
    if message["type"] == "http.response.start":
        headers = message.get("headers") or []
        if not any(k.lower() == _HEADER_BYTES for k, _ in headers):
            MutableScopeHeaders.from_message(message).setdefault(HEADER, new_request_id())
