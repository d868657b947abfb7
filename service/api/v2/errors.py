"""Errors on the Open Inference Protocol v2 routes (``/v2/...``), in its shape: ``{"error": "message"}``.

Nothing is classified here: the core says what each error is (``service/errors.py``: its kind, status
and field), and this renders it as the protocol's error object, ``Retry-After`` kept. One status
differs, as in Triton and KServe: a request that fails validation is a 400 (invalid argument), not a
422, so 400 bad input, 404 unknown model or version, 413 body over the limit, 429 / 503 with
``Retry-After``.

Use it on a router (``exception_handlers = V2_EXCEPTION_HANDLERS``, ``responses=V2_ERRORS``);
middlewares that answer before any handler (auth 401, overload 503) render with ``v2_error_body`` for
``is_v2_path``, as the app registers it. A stream broken mid-way ends with one ``data: {"error": ...}``
chunk (``v2_stream_error``), as Triton's generate_stream does.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap

from service.api.http.errors import error_responses, handlers
from service.api.v2.schemas import V2ErrorBody
from service.errors import Problem, problem_of

V2_PREFIX = "/v2"


def is_v2_path(path: str) -> bool:
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")


def v2_status(status: int) -> int:
    """Validation failures are 400s in the protocol (Triton's INVALID_ARG); every other status is kept."""
    return 400 if status == 422 else status


def v2_error_body(problem: Problem) -> dict[str, Any]:
    return {"error": problem.headline or problem.kind}


def v2_response(request: Request[Any, Any, Any], problem: Problem) -> Response[dict[str, Any]]:
    status = v2_status(problem.status)
    return Response(v2_error_body(problem), status_code=status, headers=problem.response_headers() or None)


V2_EXCEPTION_HANDLERS: ExceptionHandlersMap = handlers(v2_response)
"""The exception handlers of the v2 routes: set them as a router's ``exception_handlers``."""


def v2_stream_error(exc: Exception, request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The ``data: {"error": ...}`` chunk that ends a generate_stream broken mid-way."""
    return v2_error_body(problem_of(exc, f"{request.method} {request.url.path}"))


def v2_error_responses(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error statuses a v2 route answers with, in the protocol's error shape."""
    on_400 = "; `validation_error` (a tensor or parameter is invalid)"
    return error_responses(*codes, body=V2ErrorBody, on_400=on_400)


V2_ERRORS = v2_error_responses(400, 404, 408, 413, 429, 500, 503, 504)
"""The statuses a v2 inference route answers with (validation errors are 400s here)."""
