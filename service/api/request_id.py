"""Request ids: taken from the client's X-Request-ID when sane, else made up; echoed on every response.

Error bodies carry it too, so a client's bug report points at one log line.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
STATE_KEY = "request_id"
_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    state = connection.scope.get("state") or {}
    value = state.get(STATE_KEY)
    return str(value) if value is not None else None


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == HEADER.encode()), "")
        rid = given if _SANE.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})[STATE_KEY] = rid  # type: ignore[typeddict-item]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER.encode(), rid.encode())]
            await send(message)

        await app(scope, receive, send_with_id)

    return middleware


async def ensure_request_id_header(message: Message, scope: Scope) -> None:
    """A ``before_send`` hook: answers that no route produced (404, 405) get an X-Request-ID too."""
    if message["type"] == "http.response.start":
        MutableScopeHeaders.from_message(message).setdefault(HEADER, uuid.uuid4().hex)
