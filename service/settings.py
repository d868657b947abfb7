"""Service configuration: every knob is an environment variable (no prefix), read by pydantic-settings.

Field names are the lower-case variable names; matching is case-insensitive, so
``MAX_BATCH_SIZE=8`` in the environment and ``Settings(MAX_BATCH_SIZE=8)`` in code
both set ``settings.max_batch_size``. The defaults below are the documented
defaults (README, "Configuration").
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class Settings(BaseSettings):
    """All service settings; an unknown keyword in code is an error, unrelated environment variables are not."""

    model_config = SettingsConfigDict(
        case_sensitive=False, extra="forbid", protected_namespaces=(), env_ignore_empty=True
    )

    # --- where and how to serve ---------------------------------------------------------
    model_repository: Path = Field(
        default=Path("models"), description="Model repository: one folder per model"
    )
    host: str = Field(default="127.0.0.1", description="Bind address (0.0.0.0 in containers)")
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, description="uvicorn worker processes; each loads its own models")
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"

    # --- ONNX Runtime --------------------------------------------------------------------
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto",
        description="auto: CUDA when the session really gets it, else CPU; cuda: fail without it",
    )
    intra_op_threads: int = Field(default=0, ge=0, description="0 lets ONNX Runtime choose")
    inter_op_threads: int = Field(default=1, ge=0)

    # --- dynamic batching (encoder models, translator) ---------------------------------
    max_batch_size: int = Field(default=32, ge=1)
    max_batch_tokens: int = Field(
        default=8192, ge=1, description="Padded-token budget per batch (longest x count)"
    )
    max_queue_delay_ms: float = Field(default=5.0, ge=0)
    max_queue_size: int = Field(default=256, ge=1, description="Waiting items per model; beyond it: 429")
    queue_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait in a queue; beyond it: 503")

    # --- generation (continuous batching) ------------------------------------------------
    max_running_sequences: int = Field(default=16, ge=1, description="Sequences decoded together per step")

    # --- request limits ------------------------------------------------------------------
    max_text_chars: int = Field(default=4096, ge=1, description="Characters per text, prompt or question")
    max_context_chars: int = Field(default=20000, ge=1, description="Characters per QA context")
    max_items: int = Field(
        default=32, ge=1, description="Inputs per request (texts, images, prompts, QA pairs)"
    )
    max_new_tokens: int = Field(default=256, ge=1, description="Upper bound of max_new_tokens")
    max_body_bytes: int = Field(default=4 * MiB, ge=1024, description="Request body limit (413 beyond)")
    max_image_bytes: int = Field(default=2 * MiB, ge=1, description="Encoded bytes per image")
    max_image_pixels: int = Field(
        default=4096 * 4096, ge=1, description="Width x height per image, read from the header"
    )

    # --- start-up, cache, shutdown -------------------------------------------------------
    warmup: bool = Field(default=True, description="Run one real inference per model before reporting ready")
    redis_url: str | None = Field(default=None, description="Response cache; unset: in-process LRU")
    cache_ttl_s: int = Field(default=3600, ge=0)
    cache_max_entries: int = Field(default=10000, ge=0)
    shutdown_timeout_s: float = Field(
        default=30.0, ge=0, description="Deadline for in-flight work on SIGTERM"
    )

    @model_validator(mode="after")
    def _items_fit_the_queue(self) -> Settings:
        # One request's items enter a model queue together; more than the queue holds could never be admitted.
        if self.max_items > self.max_queue_size:
            raise ValueError(
                f"MAX_ITEMS ({self.max_items}) must not exceed MAX_QUEUE_SIZE ({self.max_queue_size})"
            )
        return self
