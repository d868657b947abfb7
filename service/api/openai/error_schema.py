"""The error body of the OpenAI-compatible routes: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.api.http.error_body import ERROR_KINDS


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="OpenAI's class of error: invalid_request_error | authentication_error | "
        "rate_limit_error | server_error"
    )
    param: str | None = Field(default=None, description="The (first) request field at fault")
    code: str | None = Field(
        default=None, description="This service's error kind: " + " | ".join(ERROR_KINDS)
    )


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail
