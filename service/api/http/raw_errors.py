"""Error answers sent by a middleware, before any handler runs: the same JSON shape as api/errors.py
(OpenAI's on the OpenAI-compatible paths, see api/openai_errors.py; the Open Inference Protocol's on /v2,
see api/v2_errors.py)."""

from __future__ import annotations

import json

from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Scope, Send

from service.api.http.error_body import ErrorBody, ErrorDetail
from service.api.http.request_id import STATE_KEY
from service.api.openai.errors import is_openai_path, openai_error_body
from service.api.v2.errors import is_v2_path, v2_error_body


async def send_error(
    scope: Scope,
    send: Send,
    status: int,
    kind: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    request_id = str((scope.get("state") or {}).get(STATE_KEY) or "") or None
    if is_openai_path(scope["path"]):  # OpenAI's clients read OpenAI's error shape
        body = json.dumps(openai_error_body(status, kind, message, field)).encode()
    elif is_v2_path(scope["path"]):  # Triton / KServe clients read {"error": "..."}
        body = json.dumps(v2_error_body(message)).encode()
    else:
        detail = ErrorDetail(type=kind, message=message, field=field, request_id=request_id)
        body = ErrorBody(error=detail).model_dump_json(exclude_none=True).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    start: HTTPResponseStartEvent = {"type": "http.response.start", "status": status, "headers": raw_headers}
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(start)
    await send(end)
