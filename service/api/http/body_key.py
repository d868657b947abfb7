"""An API key sent in the request's body, as LibreTranslate's clients send ``api_key``: found before the key
check (``auth.py``) runs, and presented to it as the ``X-API-Key`` header would be.

Only on the paths a door names (``is_body_keyed``), only where keys are configured, and only when no key
came in the headers: then the body is read whole first, within MAX_BODY_BYTES and BODY_READ_TIMEOUT_S
(``admission.read_whole_body``: 413 and 408 as there), and given again to what follows. A JSON object's
``api_key`` string, or a form's (``application/x-www-form-urlencoded``) first ``api_key`` value, is the key;
a body without one goes on without a key, and the key check answers it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qs

from litestar.types import ASGIApp, Receive, Scope, Send

from service.access.keys import presented_key
from service.api.http.admission import read_whole_body


def _media_type(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower().decode("latin-1")
    return ""


def key_in_body(body: bytes, media_type: str) -> bytes:
    """The ``api_key`` a JSON object or a urlencoded form carries (b"" when none, or unreadable)."""
    try:
        if media_type == "application/json" or media_type.endswith("+json"):
            value = json.loads(body)
            key = value.get("api_key") if isinstance(value, dict) else None
        else:
            key = parse_qs(body.decode("utf-8"), max_num_fields=64).get("api_key", [None])[0]
    except (ValueError, UnicodeDecodeError, RecursionError):
        return b""  # the route answers the malformed body itself
    return key.strip().encode() if isinstance(key, str) else b""


def keys_from_bodies(
    is_body_keyed: Callable[[str], bool], max_body_bytes: int, body_timeout_s: float
) -> Callable[[ASGIApp], ASGIApp]:
    def middleware_factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["type"] != "http"
                or not is_body_keyed(scope["path"])
                or presented_key(dict(scope["headers"]))
            ):
                await app(scope, receive, send)
                return
            read = await read_whole_body(scope, receive, send, max_body_bytes, body_timeout_s)
            if read is None:
                return
            replayed, body = read
            key = key_in_body(body, _media_type(scope))
            if key:
                scope["headers"] = [*scope["headers"], (b"x-api-key", key)]
            await app(scope, replayed, send)

        return middleware

    return middleware_factory
