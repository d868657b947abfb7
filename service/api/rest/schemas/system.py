"""GET /v1/models (OpenAI's list shape, with this service's fields beside), GET /health/live, GET /health/ready."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class VariantOut(BaseModel):
    """The public part of a manifest's variant record (``service.engine.manifest.Variant``)."""

    precision: str
    fused: bool
    devices: list[str]
    metric: str | None = Field(description="The validation metric the accuracy rule compares")
    validation: dict[str, float] | None = Field(description="This variant's metrics (null: not measured)")
    delta: dict[str, float] | None = Field(description="Variant minus reference, per metric")
    tolerance: float | None = Field(description="The largest drop of `metric` the rule allows")
    batch_max_abs_diff: float | None = Field(
        default=None, description="How far a row's outputs move with what shares its batch (fp32: 0)"
    )
    speed_over_fused: float | None = Field(
        default=None, description="int8: its speed over the fused graphs' where the model was built"
    )
    serve_by_default: bool
    reason: str


class ModelOut(BaseModel):
    # OpenAI's model object: id, object, created, owned_by.
    id: str = Field(description="The model's name: what `model` takes in a request")
    object: Literal["model"] = "model"
    created: int = Field(description="Unix seconds the model folder was written (its manifest's mtime)")
    owned_by: str = "tserve"
    # This service's own fields.
    name: str = Field(description="Same as `id`")
    task: str
    version: str = Field(description="Content hash of the model's files (its newest served version)")
    versions: list[str] = Field(
        default_factory=list,
        description="Every served version, newest first: version folder numbers, or the content hash of a "
        "model folder that is its only version; a request picks one as `model@version`",
    )
    state: str = Field(default="READY", description="READY: it answers now")
    architecture: str | None
    description: str | None
    execution_provider: str = Field(description="The ONNX Runtime provider the session really got")
    variant: str = Field(
        description="The copy of the graphs served: reference (fp32 as exported), fused, int8 or fp16 (MODEL_VARIANT)"
    )
    precision: str = Field(description="The served graphs' precision: fp32, int8 or fp16")
    variant_reason: str = Field(description="Why this variant is served, in words")
    kv_cache: Literal["inplace", "concat"] | None = Field(
        default=None,
        description="Decoders: how decoding steps grow the KV cache (inplace: a buffer per running batch "
        "that each step writes into; concat: a copy of the past per step); null for the other models",
    )
    variants: dict[str, VariantOut] = Field(
        default_factory=dict,
        description="Every optimized variant the export wrote, with its validation metrics, its difference "
        "from the reference and whether it passed the accuracy rule",
    )
    labels: list[str] | None = None
    limits: dict[str, Any] = Field(
        description="The model's own limits (token windows, QA stride, image size)"
    )
    default_for: list[str] = Field(description="Tasks this model answers when a request names no model")
    validation: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="The model's evaluation figures from its manifest, per data split (metrics, examples), "
        "measured at export on the served artifacts",
    )
    origin: dict[str, Any] | None = Field(
        default=None,
        description="An imported checkpoint (python -m model_export import): its name, folder, architecture "
        "and the sha256 over its files; null for the models built here",
    )
    checks: dict[str, Any] | None = Field(
        default=None,
        description="An imported checkpoint's figures against transformers, measured at import on the "
        "served files (logits, generated tokens, spans, entities, embeddings: docs/IMPORT.md)",
    )


class NotServedOut(BaseModel):
    name: str = Field(description="Folder name under MODEL_REPOSITORY")
    state: str = Field(description="UNAVAILABLE, or LOADING")
    reason: str = Field(description="unloaded, or not resident (loads on its first request)")


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
    max_request_pixels: int = Field(description="Width x height summed over one request's images")
    max_context_tokens: int = Field(description="QA: tokens in one request's windows, all pairs together")


class ModelsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut] = Field(description="Loaded models (OpenAI's list)")
    models: list[ModelOut] = Field(
        description="Deprecated alias of `data`, kept for one release (to be removed in 0.3)"
    )
    refused: list[RefusedOut] = Field(description="Folders that did not load, or failed their warm-up")
    not_served: list[NotServedOut] = Field(
        default_factory=list,
        description="With MODEL_CONTROL_MODE or MODEL_MEMORY_BUDGET: folders of the repository not served "
        "now, and why",
    )
    limits: RequestLimitsOut = Field(description="Request limits of this deployment")


class LiveResponse(BaseModel):
    status: str = "alive"


class ReadyResponse(BaseModel):
    status: str = Field(description="ready | starting | draining | stopping | stopped | no_models")
    models: dict[str, str] = Field(description="Loaded models -> ready")
    refused: dict[str, str] = Field(description="Refused folders -> reason")
    cache: str = Field(description="ok | degraded (Redis unreachable: serving uncached) | disabled")
    cache_backend: str = Field(description="memory | redis | disabled")
