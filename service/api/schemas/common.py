"""Pieces every inference schema shares: the single-or-batch text input, the response envelope, usage."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.inference.results import Usage


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank_text", "must not be empty or whitespace only")
    return value


# Length limits are configurable (MAX_TEXT_CHARS, ...) and checked after parsing; see service/api/limits.py.
Text = Annotated[str, AfterValidator(_not_blank)]
ModelName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]


class Request(BaseModel):
    """Unknown fields are rejected: a misspelt parameter must not silently fall back to its default."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        default=None, description="Served model name; default: the task's default model"
    )
    cache: bool = Field(
        default=True,
        description="false: skip the response-cache look-up (the fresh result is still stored); "
        "the same as the request header `Cache-Control: no-cache`",
    )


def exactly_one(values: dict[str, Any], *fields: str) -> None:
    """Model-level check that one of ``fields`` is given; the error names the first field."""
    given = [f for f in fields if values.get(f) is not None]
    if len(given) != 1:
        names = " or ".join(repr(f) for f in fields)
        which = "none" if not given else " and ".join(repr(f) for f in given)
        raise PydanticCustomError(
            "one_input",
            "give exactly one of {names} (got {which})",
            {"names": names, "which": which, "field": fields[0]},
        )


class TextInput(Request):
    """``text`` (one input) or ``texts`` (a batch); results come back as a list either way."""

    text: Text | None = Field(default=None, description="One input text (at most MAX_TEXT_CHARS characters)")
    texts: list[Text] | None = Field(
        None, min_length=1, description="A batch of texts (at most MAX_ITEMS), answered in order"
    )

    @model_validator(mode="after")
    def _one_input(self) -> TextInput:
        exactly_one({"text": self.text, "texts": self.texts}, "text", "texts")
        return self

    @property
    def input_field(self) -> str:
        return "text" if self.text is not None else "texts"

    def fields_and_texts(self) -> list[tuple[str, str]]:
        if self.text is not None:
            return [("text", self.text)]
        return [(f"texts[{i}]", t) for i, t in enumerate(self.texts or [])]


class UsageOut(BaseModel):
    input_tokens: int = Field(description="Tokens fed to the model (images: patches + [CLS])")
    output_tokens: int = Field(description="Tokens generated (translation, generation); 0 otherwise")
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> UsageOut:
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
        )


class InferenceResponse(BaseModel):
    model: str
    model_version: str = Field(description="Content hash of the model's files")
    cached: bool = Field(description="Answered from the response cache")
    usage: UsageOut
