"""POST /v1/embed (this API's envelope) and OpenAI's POST /v1/embeddings: sentence embeddings."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from service.api.rest.schemas.common import (
    InferenceResponse,
    ModelName,
    Text,
    TextInput,
    exactly_one_of,
    json_body,
)
from service.pipelines.results import Embedding


class EmbedRequest(TextInput):
    normalize: bool = Field(
        default=True,
        description="true: unit-length vectors (compare them by dot product = cosine); false: the mean of "
        "the token states over the text before normalisation, as TEI's normalize: false",
    )


EmbedBody = Annotated[EmbedRequest, json_body(EmbedRequest, exactly_one_of("text", "texts"))]


class EmbeddingOut(BaseModel):
    embedding: list[float] = Field(description="The sentence embedding (float32 values)")
    dimensions: int = Field(description="Its length: the model's hidden size")
    truncated: bool = Field(default=False, description="The text was cut to the model's window")

    @classmethod
    def of(cls, e: Embedding) -> EmbeddingOut:
        return cls(embedding=e.vector, dimensions=len(e.vector), truncated=e.truncated)


class EmbedResponse(InferenceResponse):
    results: list[EmbeddingOut]


# --- OpenAI ------------------------------------------------------------------------------------------


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


class EmbeddingsRequest(BaseModel):
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

    def fields_and_texts(self) -> list[tuple[str, str]]:
        if isinstance(self.input, str):
            return [("input", self.input)]
        return [(f"input[{i}]", t) for i, t in enumerate(self.input)]


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
