"""Errors on the OpenAI-compatible routes, in OpenAI's shape: ``{"error": {message, type, param, code}}``.

Nothing is classified here: the core says what each error is (``service/errors.py``: its kind, status
and field), and this renders it: ``code`` is our error kind (``model_not_found``, ``queue_full``, ...),
``param`` our ``field``, ``type`` OpenAI's class of error for the status, and ``Retry-After`` is kept.
One status differs, as in OpenAI's API and vLLM: a request that fails validation answers 400, not 422,
so that clients catching ``openai.BadRequestError`` see it.

Use it on a router (``exception_handlers = OPENAI_EXCEPTION_HANDLERS``, ``responses=OPENAI_ERRORS``
for the documented statuses); middlewares that answer before any handler (auth 401, overload 503)
render with ``openai_error_body`` for ``OPENAI_PATHS``, as the app registers it. Mid-stream errors are
sent as one ``data: {"error": ...}`` chunk (``openai_stream_error``).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap

from service.api.http.errors import error_responses, handlers
from service.api.openai.schemas import OpenAIErrorBody, OpenAIErrorDetail
from service.errors import Problem, problem_of

# The paths whose errors are OpenAI-shaped, also when a middleware answers (auth, overload).
OPENAI_PATHS = (
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/score",
)


def is_openai_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS)


def openai_status(status: int) -> int:
    """Validation failures are 400s on the OpenAI routes (OpenAI and vLLM do so); every other status is kept."""
    return 400 if status == 422 else status


def openai_error_type(status: int) -> str:
    """OpenAI's ``error.type`` for a status."""
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def openai_error_body(problem: Problem) -> dict[str, Any]:
    """A ``Problem`` in OpenAI's error shape."""
    status = openai_status(problem.status)
    detail = OpenAIErrorDetail(
        message=problem.headline, type=openai_error_type(status), param=problem.field, code=problem.kind
    )
    return OpenAIErrorBody(error=detail).model_dump()


def openai_response(request: Request[Any, Any, Any], problem: Problem) -> Response[dict[str, Any]]:
    status = openai_status(problem.status)
    return Response(
        openai_error_body(problem), status_code=status, headers=problem.response_headers() or None
    )


OPENAI_EXCEPTION_HANDLERS: ExceptionHandlersMap = handlers(openai_response)
"""The exception handlers of the OpenAI routes: set them as a router's ``exception_handlers``."""


def openai_stream_error(exc: Exception, request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The body of the ``data: {"error": ...}`` chunk that ends a stream broken mid-way (as vLLM sends it)."""
    return openai_error_body(problem_of(exc, f"{request.method} {request.url.path}"))


def openai_error_responses(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error statuses an OpenAI route answers with, in OpenAI's error shape."""
    return error_responses(*codes, body=OpenAIErrorBody, on_400="; `validation_error` (a field is invalid)")


OPENAI_ERRORS = openai_error_responses(400, 404, 408, 413, 415, 429, 500, 503, 504)
"""The statuses an OpenAI inference route answers with (validation errors are 400s here)."""
