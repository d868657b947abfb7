"""Exceptions -> HTTP answers: the core's ``Problem`` (``service/errors.py``), rendered by a door.

``problem_of_request`` reads an exception raised while answering an HTTP request: Litestar's own
(schema validation, routing, body size) here, everything else through the core's ``problem_of``.
``handlers(render)`` makes the exception handlers of a door that renders problems its own way;
``EXCEPTION_HANDLERS`` are the REST door's, the app's default. A validation failure is a 422 with
every field listed; a 500 is a bug, logged with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap
from pydantic import ValidationError as PydanticValidationError

from service.api.http.error_body import ErrorBody, error_body
from service.api.http.request_id import request_id_of
from service.errors import FieldProblem, Problem, describe_status, problem_of

log = logging.getLogger(__name__)

# A door's rendering of a problem as the answer to a request.
Render = Callable[[Request[Any, Any, Any], Problem], Response[Any]]


def field_path(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """Pydantic's loc -> ``texts[2]`` / ``items[0].context``; None for the body as a whole."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or None


def _pydantic_errors(exc: ValidationException) -> list[FieldProblem] | None:
    """Litestar keeps pydantic's structured errors as the cause; prefer them to its dotted keys."""
    cause = exc.__cause__
    raw = getattr(cause, "errors", None)
    if isinstance(cause, PydanticValidationError):
        raw = cause.errors()
    if not isinstance(raw, list):
        return None
    out = []
    for err in raw:
        loc = tuple(err.get("loc", ()))
        ctx = err.get("ctx") or {}
        field = field_path(loc) or ctx.get("field")  # model-level checks name their field in ctx
        out.append(FieldProblem(field, str(err.get("msg", "")), str(err.get("type", "invalid"))))
    return out


def _validation(request: Request[Any, Any, Any], exc: ValidationException) -> Problem:
    errors = _pydantic_errors(exc)
    if errors is None:  # Litestar's own checks (a missing body, a form field): {"key", "message"}
        errors = [
            FieldProblem(e.get("key"), str(e.get("message", "")), "invalid")
            for e in (exc.extra if isinstance(exc.extra, list) else [])
            if isinstance(e, dict)
        ]
    multipart = request.headers.get("content-type", "").startswith("multipart/")
    errors = [
        FieldProblem(
            "file" if multipart else None,
            "a `file` form field is required" if multipart else "a JSON object body is required",
            e.type,
        )
        if e.field == "data"  # Litestar's name for the body itself: missing, or a form without its file
        else e
        for e in errors
    ]
    first = errors[0] if errors else FieldProblem(None, str(exc.detail), "invalid")
    return Problem("validation_error", first.message, first.field, tuple(errors))


_HTTP_KINDS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def _http(exc: HTTPException) -> Problem:
    """Litestar's own HTTP errors (routing, body size, unparseable body): their status kept."""
    status = exc.status_code
    kind = _HTTP_KINDS.get(status, "internal_error" if status >= 500 else "bad_request")
    message = str(exc.detail)
    if status == 400 and isinstance(exc.__cause__, SerializationException):  # the body did not parse
        kind = "malformed_json"
    if status == 413:
        message = "request body is over the size limit (MAX_BODY_BYTES)"
    if status >= 500:
        log.error("HTTP %s: %s", status, message)
    headers = tuple((exc.headers or {}).items())
    return Problem(kind, message, status_override=status, headers=headers)


def problem_of_request(request: Request[Any, Any, Any], exc: Exception) -> Problem:
    if isinstance(exc, ValidationException):
        return _validation(request, exc)
    if isinstance(exc, HTTPException):
        return _http(exc)
    return problem_of(exc, f"{request.method} {request.url.path}")


def handlers(render: Render) -> ExceptionHandlersMap:
    """The exception handlers of a door whose answers ``render`` shapes: every exception, one reading."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        return render(request, problem_of_request(request, exc))

    return {Exception: handle}


def rest_response(request: Request[Any, Any, Any], problem: Problem) -> Response[dict[str, Any]]:
    body = error_body(problem, request_id_of(request)).model_dump(exclude_none=True)
    return Response(body, status_code=problem.status, headers=problem.response_headers() or None)


EXCEPTION_HANDLERS: ExceptionHandlersMap = handlers(rest_response)


def error_responses(*codes: int, body: type[Any] = ErrorBody, on_400: str = "") -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error statuses an endpoint can answer with, in ``body``'s shape (a door that
    answers validation errors as 400s says so in ``on_400``)."""
    return {
        code: ResponseSpec(
            data_container=body,
            description=describe_status(code) + (on_400 if code == 400 else ""),
            generate_examples=False,
        )
        for code in codes
    }


INFERENCE_ERRORS = error_responses(400, 404, 408, 413, 415, 422, 429, 500, 503, 504)
