"""POST /v1/embed: sentence embeddings in this API's envelope."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from service.api.http.body_schema import exactly_one_of, json_body
from service.api.rest.schemas.common import InferenceResponse, TextInput, Truncating
from service.inference import Embedding


class EmbedRequest(TextInput, Truncating):
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
