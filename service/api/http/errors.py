"""Domain errors -> HTTP responses, in ONE exception-handler table (``EXCEPTION_HANDLERS``).

Every error kind and its status is listed once, in ``schemas.errors.ERROR_KINDS``.
Litestar's own 400 for schema failures is turned into 422 here, with every field
listed; a 500 is a bug, logged with its traceback.
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

from service.api.http.error_body import ErrorBody, ErrorDetail, FieldError, describe_status
from service.api.http.request_id import request_id_of
from service.errors import (
    InvalidInputError,
    ModelNotFoundError,
    NoModelForTaskError,
    NotReadyError,
    ServiceError,
)
from service.inference import BatcherClosedError, EngineError, QueueFullError, QueueTimeoutError

log = logging.getLogger(__name__)

# Retry-After when nothing better is known (service starting or stopping, a queue timeout).
DEFAULT_RETRY_AFTER_S = 1


class UnsupportedMediaTypeError(ServiceError):
    """The request's Content-Type is not what the endpoint reads."""

    def __init__(self, got: str, expected: str) -> None:
        super().__init__(
            f"Content-Type {got or '(none)'} is not supported here; send {expected}", "Content-Type"
        )


class MalformedBodyError(ServiceError):
    """The body cannot be read as its Content-Type says: 400 ``malformed_json`` or ``bad_request``."""

    def __init__(self, message: str, kind: str = "bad_request", field: str | None = None) -> None:
        super().__init__(message, field)
        self.kind = kind


class ClientDisconnectedError(Exception):
    """The client closed the connection before its answer was ready; its work was cancelled."""


def error_response(
    request: Request[Any, Any, Any],
    status_code: int,
    kind: str,
    message: str,
    field: str | None = None,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> Response[dict[str, Any]]:
    body = ErrorBody(
        error=ErrorDetail(
            type=kind, message=message, field=field, request_id=request_id_of(request), errors=errors
        )
    )
    return Response(body.model_dump(exclude_none=True), status_code=status_code, headers=headers)


def field_path(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """Pydantic's loc -> ``texts[2]`` / ``items[0].context``; None for the body as a whole."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or None


def _pydantic_errors(exc: ValidationException) -> list[FieldError] | None:
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
        out.append(
            FieldError(field=field, message=str(err.get("msg", "")), type=str(err.get("type", "invalid")))
        )
    return out


def on_validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[dict[str, Any]]:
    errors = _pydantic_errors(exc)
    if errors is None:  # Litestar's own checks (a missing body, a form field): {"key", "message"}
        errors = [
            FieldError(field=e.get("key"), message=str(e.get("message", "")), type="invalid")
            for e in (exc.extra if isinstance(exc.extra, list) else [])
            if isinstance(e, dict)
        ]
    multipart = request.headers.get("content-type", "").startswith("multipart/")
    for e in errors:
        if e.field == "data":  # Litestar's name for the body itself: missing, or a form without its file
            e.field = "file" if multipart else None
            e.message = "a `file` form field is required" if multipart else "a JSON object body is required"
    first = errors[0] if errors else FieldError(field=None, message=str(exc.detail), type="invalid")
    message = f"{first.field}: {first.message}" if first.field else first.message
    return error_response(request, 422, "validation_error", message, first.field, errors)


def on_invalid_input(request: Request[Any, Any, Any], exc: InvalidInputError) -> Response[dict[str, Any]]:
    errors = [FieldError(field=exc.field, message=exc.message, type=exc.reason)]
    message = f"{exc.field}: {exc.message}" if exc.field else exc.message
    return error_response(request, 422, "validation_error", message, exc.field, errors)


def on_malformed_body(request: Request[Any, Any, Any], exc: MalformedBodyError) -> Response[dict[str, Any]]:
    return error_response(request, 400, exc.kind, exc.message, exc.field)


def on_model_not_found(request: Request[Any, Any, Any], exc: ServiceError) -> Response[dict[str, Any]]:
    return error_response(request, 404, "model_not_found", exc.message, exc.field)


def on_unsupported_media_type(
    request: Request[Any, Any, Any], exc: UnsupportedMediaTypeError
) -> Response[dict[str, Any]]:
    return error_response(request, 415, "unsupported_media_type", exc.message, exc.field)


def on_not_ready(request: Request[Any, Any, Any], exc: NotReadyError) -> Response[dict[str, Any]]:
    retry = {"Retry-After": str(exc.retry_after_s)}
    return error_response(request, 503, "not_ready", exc.message, headers=retry)


def on_queue_full(request: Request[Any, Any, Any], exc: QueueFullError) -> Response[dict[str, Any]]:
    retry = {"Retry-After": str(max(1, exc.retry_after_s))}
    return error_response(request, 429, "queue_full", str(exc), headers=retry)


def on_queue_timeout(request: Request[Any, Any, Any], exc: QueueTimeoutError) -> Response[dict[str, Any]]:
    retry = {"Retry-After": str(DEFAULT_RETRY_AFTER_S)}
    return error_response(request, 503, "queue_timeout", str(exc), headers=retry)


def on_closed(request: Request[Any, Any, Any], exc: BatcherClosedError) -> Response[dict[str, Any]]:
    retry = {"Retry-After": str(DEFAULT_RETRY_AFTER_S)}
    return error_response(request, 503, "unavailable", str(exc), headers=retry)


def on_disconnected(
    request: Request[Any, Any, Any], exc: ClientDisconnectedError
) -> Response[dict[str, Any]]:
    return error_response(request, 499, "client_closed_request", "the client closed the connection")


_HTTP_KINDS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def on_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    """Litestar's own HTTP errors (routing, body size, unparseable body) in our shape, status kept."""
    status = exc.status_code
    kind = _HTTP_KINDS.get(status, "internal_error" if status >= 500 else "bad_request")
    message = str(exc.detail)
    if status == 400 and isinstance(exc.__cause__, SerializationException):  # the body did not parse
        kind = "malformed_json"
    if status == 413:
        message = "request body is over the size limit (MAX_BODY_BYTES)"
    if status >= 500:
        log.error("HTTP %s: %s", status, message)
    headers = {k: v for k, v in (exc.headers or {}).items()}
    return error_response(request, status, kind, message, headers=headers or None)


def on_engine_error(request: Request[Any, Any, Any], exc: EngineError) -> Response[dict[str, Any]]:
    log.error("inference failed: %s", exc)
    return error_response(request, 500, "internal_error", "inference failed; see the service log")


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(request, 500, "internal_error", "internal error; see the service log")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ValidationException: on_validation,
    InvalidInputError: on_invalid_input,  # TaskMismatchError included
    ModelNotFoundError: on_model_not_found,
    NoModelForTaskError: on_model_not_found,
    UnsupportedMediaTypeError: on_unsupported_media_type,
    MalformedBodyError: on_malformed_body,
    NotReadyError: on_not_ready,
    QueueFullError: on_queue_full,
    QueueTimeoutError: on_queue_timeout,
    BatcherClosedError: on_closed,
    ClientDisconnectedError: on_disconnected,
    HTTPException: on_http,
    EngineError: on_engine_error,
    Exception: on_unexpected,
}


Reshape = Callable[[Response[Any]], Response[dict[str, Any]]]


def reshaped_handlers(reshape: Reshape) -> ExceptionHandlersMap:
    """``EXCEPTION_HANDLERS`` whose answers ``reshape`` re-dresses, for a protocol with its own error body.

    The classification (which error, which status, which headers) stays this module's; a
    protocol module only says how its body looks (``openai_errors``, ``v2_errors``).
    """

    def wrap(handler: Callable[..., Response[Any]]) -> Callable[..., Response[dict[str, Any]]]:
        def handle(request: Request[Any, Any, Any], exc: Any) -> Response[dict[str, Any]]:
            return reshape(handler(request, exc))

        return handle

    return {exc_type: wrap(handler) for exc_type, handler in EXCEPTION_HANDLERS.items()}  # type: ignore[misc]


def stream_error(exc: Exception, request: Request[Any, Any, Any], reshape: Reshape) -> dict[str, Any]:
    """The body of the error event that ends a stream broken mid-way, in a protocol's shape."""
    handler = next(EXCEPTION_HANDLERS[t] for t in type(exc).__mro__ if t in EXCEPTION_HANDLERS)
    content: dict[str, Any] = reshape(handler(request, exc)).content  # type: ignore[operator]
    return content


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


INFERENCE_ERRORS = error_responses(400, 404, 408, 413, 415, 422, 429, 500, 503)
