"""OpenAI-compatible embeddings: POST /v1/embeddings, OpenAI's body, answer and errors.

The same ``InferenceService.embed`` as POST /v1/embed: the same batcher, limits,
metrics and response-cache entries (``encoding_format`` only changes how the
vectors are written).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from litestar import Controller
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, Text, json_body
from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.fields import FieldNames, one_or_many
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.openai.errors import OPENAI_ERRORS, OPENAI_EXCEPTION_HANDLERS
from service.api.openai.schemas import Scheduled


def _no_token_ids(value: Any) -> Any:
    """OpenAI also takes token ids (a list of ints, or of int lists); this service embeds text only."""
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, int) or (isinstance(v, list) and v and isinstance(v[0], int)) for v in items):
        raise PydanticCustomError(
            "unsupported",
            "token-id input is not supported: send a string or a list of strings "
            "(the model's tokenizer is applied here)",
        )
    if isinstance(value, list) and not value:
        raise PydanticCustomError("too_short", "must hold at least one string")
    return value


class EmbeddingsRequest(Scheduled, NoBooleanNumbers):
    """OpenAI's ``POST /v1/embeddings`` body."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = Field(description="A feature-extraction model's name (GET /v1/models)")
    input: Text | list[Text] = Field(
        description="One text or a list (at most MAX_ITEMS, each at most MAX_TEXT_CHARS characters); "
        "token-id input is not accepted"
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="float: lists of numbers; base64: each vector's little-endian float32 bytes, base64 "
        "(what the openai client asks for by default, and decodes itself)",
    )
    dimensions: int | None = Field(
        default=None,
        ge=1,
        description="Only the model's own dimension count: its embeddings were not trained to be "
        "shortened (no Matryoshka training), so another value is refused, as vLLM does",
    )
    user: str | None = Field(default=None, max_length=256, description="Accepted and ignored")

    _check_input = field_validator("input", mode="before")(_no_token_ids)

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def field_names(self) -> FieldNames:
        return one_or_many("input", "input", isinstance(self.input, str))


EmbeddingsBody = Annotated[EmbeddingsRequest, json_body(EmbeddingsRequest)]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="Numbers, or base64 of little-endian float32 bytes")

    @classmethod
    def of(cls, index: int, vector: list[float], encoding_format: str) -> EmbeddingData:
        if encoding_format == "base64":
            raw = np.asarray(vector, dtype="<f4").tobytes()
            return cls(index=index, embedding=base64.b64encode(raw).decode("ascii"))
        return cls(index=index, embedding=vector)


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingsUsage


class EmbeddingsController(Controller):
    path = "/v1/embeddings"
    tags = ("openai",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @json_post("OpenAI-compatible embeddings", responses=OPENAI_ERRORS)
    async def embeddings(
        self, services: Services, request: HttpRequest, data: EmbeddingsBody
    ) -> EmbeddingsResponse:
        """OpenAI's Embeddings API on a feature-extraction model: unit-length vectors, as floats or base64
        (little-endian float32). ``dimensions`` other than the model's own is refused (400): its
        embeddings were not trained to be shortened. Errors are OpenAI's ``{"error": {message, type,
        param, code}}``; invalid parameters answer 400."""
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            work = services.inference.embed(
                meta, data.texts, True, data.model, cache_control(request), data.dimensions
            )
            outcome = await unless_disconnected(request, work)
        return EmbeddingsResponse(
            data=[EmbeddingData.of(i, e.vector, data.encoding_format) for i, e in enumerate(outcome.results)],
            model=outcome.model,
            usage=EmbeddingsUsage(
                prompt_tokens=outcome.usage.input_tokens, total_tokens=outcome.usage.input_tokens
            ),
        )
