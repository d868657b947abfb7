"""Error answers sent by a middleware, before any handler runs, in the shape of the door whose path it is.

A middleware (the key check's 401, admission's 408, 413 and 503) knows the ``Problem`` but not the
door: each door's shape for its paths is registered in the app's state under ``RAW_SHAPES_KEY`` (by
``create_app``, from ``api/routes.py``); any other path gets the REST shape. This layer names no door.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Scope, Send

from service.api.http.error_body import error_body
from service.api.http.request_id import STATE_KEY
from service.errors import Problem

RAW_SHAPES_KEY = "raw_error_shapes"
# (is this door's path?, the door's error body for a problem), in the app's state
RawShapes = Sequence[tuple[Callable[[str], bool], Callable[[Problem], dict[str, Any]]]]


def _body(scope: Scope, problem: Problem) -> dict[str, Any]:
    app = scope.get("app")
    shapes: RawShapes = app.state.get(RAW_SHAPES_KEY, ()) if app is not None else ()
    for is_door_path, shape in shapes:
        if is_door_path(scope["path"]):
            return shape(problem)
    request_id = str((scope.get("state") or {}).get(STATE_KEY) or "") or None
    return error_body(problem, request_id).model_dump(exclude_none=True)


async def send_error(scope: Scope, send: Send, problem: Problem) -> None:
    body = json.dumps(_body(scope, problem)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in problem.response_headers().items()]
    status = problem.status
    start: HTTPResponseStartEvent = {"type": "http.response.start", "status": status, "headers": raw_headers}
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(start)
    await send(end)
