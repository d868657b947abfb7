"""POST /v1/classify (text or base64 images) and POST /v1/classify/image (multipart upload)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from litestar.datastructures import UploadFile
from pydantic import BaseModel, Field, model_validator

from service.api.http.body_schema import Text, exactly_one_of, json_body
from service.api.http.fields import FieldNames, one_or_many
from service.api.rest.schemas.attention import AttentionFields, AttentionOut, WithAttention
from service.api.rest.schemas.common import InferenceResponse, Request, Truncating, exactly_one
from service.inference import Classification

MAX_TOP_K = 100
Base64Image = str  # the byte limit is MAX_IMAGE_BYTES after decoding; the body limit bounds the text


class ClassifyRequest(Request, AttentionFields, Truncating):
    """Exactly one of ``text``, ``texts``, ``image``, ``images``; text and images need different models."""

    text: Text | None = Field(default=None, description="One text (at most MAX_TEXT_CHARS characters)")
    texts: list[Text] | None = Field(
        default=None, min_length=1, description="A batch of texts (at most MAX_ITEMS)"
    )
    image: Base64Image | None = Field(
        None, min_length=1, description="One PNG/JPEG, base64 (a data: URL prefix is accepted)"
    )
    images: list[Base64Image] | None = Field(
        default=None, min_length=1, description="A batch of base64 images"
    )
    top_k: int = Field(
        1, ge=1, le=MAX_TOP_K, description="Labels to return per input (capped at the label count)"
    )

    @model_validator(mode="after")
    def _one_input(self) -> ClassifyRequest:
        values = {"text": self.text, "texts": self.texts, "image": self.image, "images": self.images}
        exactly_one(values, "text", "texts", "image", "images")
        if self.is_image:
            self.text_only("images")
        return self

    @property
    def is_image(self) -> bool:
        return self.image is not None or self.images is not None

    @property
    def inputs(self) -> list[str]:
        """The texts, or the base64 images."""
        single = self.text if self.text is not None else self.image
        if single is not None:
            return [single]
        return list(self.texts if self.texts is not None else self.images or [])

    def field_names(self) -> FieldNames:
        single = self.text is not None or self.image is not None
        if self.is_image:
            return one_or_many("image", "images", single)
        return one_or_many("text", "texts", single)


ClassifyBody = Annotated[
    ClassifyRequest, json_body(ClassifyRequest, exactly_one_of("text", "texts", "image", "images"))
]


@dataclass
class ImageUpload:
    """Multipart form of POST /v1/classify/image."""

    file: UploadFile
    top_k: int = 1
    model: str | None = None
    return_attention: bool = False
    attention_layer: int | None = None
    attention_head: int | None = None


class LabelScoreOut(BaseModel):
    label: str
    score: float = Field(description="Softmax probability")


class ClassificationOut(WithAttention):
    label: str = Field(description="The most probable label")
    score: float
    labels: list[LabelScoreOut] = Field(description="The top_k labels, most probable first")
    truncated: bool = Field(default=False, description="The text was cut to the model's window")

    @classmethod
    def of(cls, c: Classification) -> ClassificationOut:
        return cls(
            label=c.label,
            score=c.score,
            labels=[LabelScoreOut(label=t.label, score=t.score) for t in c.top],
            truncated=c.truncated,
            attention=AttentionOut.of(c.attention),
        )


class ClassifyResponse(InferenceResponse):
    results: list[ClassificationOut]
