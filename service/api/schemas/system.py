"""GET /v1/models, GET /health/live, GET /health/ready."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ModelOut(BaseModel):
    name: str
    task: str
    version: str = Field(description="Content hash of the model's files")
    architecture: str | None
    description: str | None
    execution_provider: str = Field(description="The ONNX Runtime provider the session really got")
    labels: list[str] | None = None
    limits: dict[str, Any] = Field(
        description="The model's own limits (token windows, QA stride, image size)"
    )
    default_for: list[str] = Field(description="Tasks this model answers when a request names no model")


class RefusedOut(BaseModel):
    name: str = Field(description="Folder name under MODEL_REPOSITORY")
    reason: str


class RequestLimitsOut(BaseModel):
    max_items: int
    max_text_chars: int
    max_context_chars: int
    max_new_tokens: int
    max_total_new_tokens: int = Field(description="items x max_new_tokens (x beam_size) per request")
    max_body_bytes: int
    max_image_bytes: int
    max_image_pixels: int


class ModelsResponse(BaseModel):
    models: list[ModelOut]
    refused: list[RefusedOut] = Field(description="Folders that did not load, or failed their warm-up")
    limits: RequestLimitsOut = Field(description="Request limits of this deployment")


class LiveResponse(BaseModel):
    status: str = "alive"


class ReadyResponse(BaseModel):
    status: str = Field(description="ready | starting | draining | stopping | stopped | no_models")
    models: dict[str, str] = Field(description="Loaded models -> ready")
    refused: dict[str, str] = Field(description="Refused folders -> reason")
    cache: str = Field(description="ok | degraded (Redis unreachable: serving uncached) | disabled")
    cache_backend: str = Field(description="memory | redis | disabled")
