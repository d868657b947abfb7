"""Errors on the OpenAI-compatible routes, in OpenAI's shape: ``{"error": {message, type, param, code}}``.

Nothing is classified here: every exception goes through the same handler as on
the rest of the API (``errors.EXCEPTION_HANDLERS``, statuses from
``schemas.errors.ERROR_KINDS``), and its answer is re-dressed: ``code`` is our
error kind (``model_not_found``, ``queue_full``, ...), ``param`` our ``field``,
``type`` OpenAI's class of error for the status, and headers (``Retry-After``)
are kept. One status differs, as in OpenAI's API and vLLM: a request that fails
validation answers 400, not 422, so that clients catching
``openai.BadRequestError`` see it.

Use it on a controller (``exception_handlers = OPENAI_EXCEPTION_HANDLERS``,
``responses=OPENAI_ERRORS`` for the documented statuses); middlewares that answer
before any handler (auth 401, overload 503) use ``openai_error_body`` for
``OPENAI_PATHS`` through ``raw_errors.send_error``. Mid-stream errors are sent as one
``data: {"error": ...}`` chunk (``openai_stream_error``).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap

from service.api.http.errors import error_responses, reshaped_handlers, stream_error
from service.api.openai.schemas import OpenAIErrorBody, OpenAIErrorDetail

# The paths whose errors are OpenAI-shaped, also when a middleware answers (auth, overload).
OPENAI_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings")


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


def openai_error_body(status: int, kind: str, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error body for one of our errors (``kind`` from ``ERROR_KINDS``) answered with ``status``."""
    detail = OpenAIErrorDetail(message=message, type=openai_error_type(status), param=param, code=kind)
    return OpenAIErrorBody(error=detail).model_dump()


def openai_response(response: Response[Any]) -> Response[dict[str, Any]]:
    """One of ``errors.py``'s answers (``{"error": {type, message, field, ...}}``) in OpenAI's shape."""
    detail = response.content.get("error", {}) if isinstance(response.content, dict) else {}
    status = openai_status(response.status_code or 500)
    body = openai_error_body(
        status,
        str(detail.get("type", "internal_error")),
        str(detail.get("message", "")),
        detail.get("field"),
    )
    return Response(body, status_code=status, headers=dict(response.headers) or None)


OPENAI_EXCEPTION_HANDLERS: ExceptionHandlersMap = reshaped_handlers(openai_response)
"""``EXCEPTION_HANDLERS`` with OpenAI's body: set it as a controller's ``exception_handlers``."""


def openai_stream_error(exc: Exception, request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The body of the ``data: {"error": ...}`` chunk that ends a stream broken mid-way (as vLLM sends it)."""
    return stream_error(exc, request, openai_response)


def openai_error_responses(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error statuses an OpenAI route answers with, in OpenAI's error shape."""
    return error_responses(*codes, body=OpenAIErrorBody, on_400="; `validation_error` (a field is invalid)")


OPENAI_ERRORS = openai_error_responses(400, 404, 408, 413, 415, 429, 500, 503)
"""The statuses an OpenAI inference route answers with (validation errors are 400s here)."""
