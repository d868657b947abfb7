"""Errors on LibreTranslate's routes, in its shape: ``{"error": "message"}``.

As LibreTranslate answers: a request it cannot take is a 400 (a validation error here is a 422 on the REST
door), a rate limit a 429 whose message starts "Slowdown: ", anything else keeps the core's status
(``service/errors.py``). The key check's answer before a handler runs is rendered the same way
(``libretranslate_error_body``, registered for ``is_libretranslate_path`` in ``api/routes.py``).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap
from pydantic import BaseModel

from service.api.http.errors import error_responses, handlers
from service.errors import Problem

# Paths whose errors are LibreTranslate's shape; the first two carry ``api_key`` in their bodies.
BODY_KEYED_PATHS = ("/translate", "/detect")
LIBRETRANSLATE_PATHS = (*BODY_KEYED_PATHS, "/languages", "/frontend/settings")


class LibreTranslateErrorBody(BaseModel):
    error: str


def is_libretranslate_path(path: str) -> bool:
    return path in LIBRETRANSLATE_PATHS


def is_body_keyed_path(path: str) -> bool:
    return path in BODY_KEYED_PATHS


def libretranslate_status(status: int) -> int:
    return 400 if status == 422 else status


def libretranslate_error_body(problem: Problem) -> dict[str, Any]:
    message = problem.headline
    if problem.status == 429:
        message = f"Slowdown: {message}"
    return {"error": message}


def libretranslate_response(request: Request[Any, Any, Any], problem: Problem) -> Response[dict[str, Any]]:
    return Response(
        libretranslate_error_body(problem),
        status_code=libretranslate_status(problem.status),
        headers=problem.response_headers() or None,
    )


LIBRETRANSLATE_EXCEPTION_HANDLERS: ExceptionHandlersMap = handlers(libretranslate_response)

LIBRETRANSLATE_ERRORS: dict[int, ResponseSpec] = error_responses(
    400, 401, 413, 429, 503, body=LibreTranslateErrorBody, on_400="; any invalid parameter, as LibreTranslate"
)
