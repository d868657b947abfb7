"""The one error shape every endpoint answers with (documented in OpenAPI for each of them)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class FieldError(BaseModel):
    field: str | None = Field(
        default=None, description="Request field at fault, e.g. `texts[2]`, `items[0].context`"
    )
    message: str
    type: str = Field(description="Machine-readable reason, e.g. `string_too_long`, `blank_text`")


class ErrorDetail(BaseModel):
    type: str = Field(
        description="validation_error | model_not_found | malformed_json | bad_request | payload_too_large | "
        "unsupported_media_type | queue_full | queue_timeout | not_ready | unavailable | not_found | "
        "method_not_allowed | client_closed_request | unauthorized | overloaded | internal_error"
    )
    message: str
    field: str | None = Field(default=None, description="The (first) request field at fault")
    request_id: str | None = Field(default=None, description="Also sent as the X-Request-ID response header")
    errors: list[FieldError] | None = Field(
        default=None, description="Every field error, for validation errors"
    )


class ErrorBody(BaseModel):
    error: ErrorDetail
