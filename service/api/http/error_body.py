"""The one error shape every endpoint answers with (documented in OpenAPI for each of them)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class ErrorKind:
    status: int
    when: str


# Every ``error.type`` the API answers with: its HTTP status and when it is sent. The OpenAPI
# descriptions of each status and of ``ErrorDetail.type`` are made from this one table.
ERROR_KINDS: dict[str, ErrorKind] = {
    "malformed_json": ErrorKind(400, "the body is not JSON"),
    "bad_request": ErrorKind(400, "an unreadable request"),
    "unauthorized": ErrorKind(401, "no valid API key: Authorization: Bearer KEY or X-API-Key: KEY"),
    "model_not_found": ErrorKind(404, "no loaded model by that name, or none for the task (field `model`)"),
    "not_found": ErrorKind(404, "no such path"),
    "method_not_allowed": ErrorKind(405, "the path does not take this method"),
    "request_timeout": ErrorKind(
        408, "the body did not arrive within BODY_READ_TIMEOUT_S; the connection is closed"
    ),
    "payload_too_large": ErrorKind(413, "body over MAX_BODY_BYTES"),
    "unsupported_media_type": ErrorKind(415, "wrong Content-Type (field `Content-Type`)"),
    "validation_error": ErrorKind(
        422,
        "a field is invalid: range, empty/whitespace/oversized text, too many items, undecodable image, "
        "model serving another task (with `field` and `errors`)",
    ),
    "queue_full": ErrorKind(429, "the model's queue is full; retry after the `Retry-After` header's seconds"),
    "client_closed_request": ErrorKind(499, "the client went away; nobody reads it, but logs and metrics do"),
    "internal_error": ErrorKind(
        500, "a bug in the service, logged with its traceback; never caused by request content"
    ),
    "not_ready": ErrorKind(503, "the service is starting or draining; see `Retry-After`"),
    "queue_timeout": ErrorKind(503, "the request waited too long in the queue; see `Retry-After`"),
    "unavailable": ErrorKind(503, "the model is shutting down; see `Retry-After`"),
    "overloaded": ErrorKind(503, "MAX_IN_FLIGHT_REQUESTS are being answered; see `Retry-After`"),
}


def describe_status(status: int) -> str:
    """The kinds an HTTP status carries, for its OpenAPI description."""
    return "; ".join(f"`{kind}`: {k.when}" for kind, k in ERROR_KINDS.items() if k.status == status)


class FieldError(BaseModel):
    field: str | None = Field(
        default=None, description="Request field at fault, e.g. `texts[2]`, `items[0].context`"
    )
    message: str
    type: str = Field(description="Machine-readable reason, e.g. `string_too_long`, `blank_text`")


class ErrorDetail(BaseModel):
    type: str = Field(description=" | ".join(ERROR_KINDS))
    message: str
    field: str | None = Field(default=None, description="The (first) request field at fault")
    request_id: str | None = Field(default=None, description="Also sent as the X-Request-ID response header")
    errors: list[FieldError] | None = Field(
        default=None, description="Every field error, for validation errors"
    )


class ErrorBody(BaseModel):
    error: ErrorDetail
