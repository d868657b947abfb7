"""The REST error shape (``{"error": {type, message, field, request_id, errors}}``), documented in OpenAPI."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.errors import KINDS, Problem


class FieldError(BaseModel):
    field: str | None = Field(
        default=None, description="Request field at fault, e.g. `texts[2]`, `items[0].context`"
    )
    message: str
    type: str = Field(description="Machine-readable reason, e.g. `string_too_long`, `blank_text`")


class ErrorDetail(BaseModel):
    type: str = Field(description=" | ".join(KINDS))
    message: str
    field: str | None = Field(default=None, description="The (first) request field at fault")
    request_id: str | None = Field(default=None, description="Also sent as the X-Request-ID response header")
    errors: list[FieldError] | None = Field(
        default=None, description="Every field error, for validation errors"
    )


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_body(problem: Problem, request_id: str | None) -> ErrorBody:
    """A ``Problem`` in the REST shape."""
    errors = [FieldError(field=e.field, message=e.message, type=e.type) for e in problem.errors] or None
    detail = ErrorDetail(
        type=problem.kind, message=problem.headline, field=problem.field, request_id=request_id, errors=errors
    )
    return ErrorBody(error=detail)
