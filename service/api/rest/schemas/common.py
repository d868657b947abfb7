"""Pieces every inference schema shares: the single-or-batch text input, the response envelope, usage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, Text
from service.api.http.fields import FieldNames, one_or_many
from service.inference import CUT_RIGHT, Truncation, Usage
from service.inference.params import RANGES
from service.inference.scheduling import CLASSES
from service.metadata import RequestMeta


def ranged(name: str, default: Any, description: str) -> Any:
    """A field whose range is the inference core's for the parameter ``name`` (``inference.params.RANGES``):
    the JSON Schema documents the numbers the core checks, written once there."""
    r = RANGES[name]
    low, high = (int(r.low), int(r.high)) if r.integer else (r.low, r.high)
    if r.low_open:
        return Field(default=default, description=description, gt=low, le=high)
    return Field(default=default, description=description, ge=low, le=high)


class Request(NoBooleanNumbers):
    """Unknown fields are rejected: a misspelt parameter must not silently fall back to its default; a
    boolean is not a number (``NoBooleanNumbers``)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = Field(
        default=None, description="Served model name; default: the task's default model"
    )
    cache: bool = Field(
        default=True,
        description="false: skip the response-cache look-up (the fresh result is still stored); "
        "the same as the request header `Cache-Control: no-cache`",
    )
    priority: Literal["high", "normal", "low"] | None = Field(
        default=None,
        description="Queue priority class (default: `X-Request-Priority`, else normal): the most urgent "
        "waiting work is taken first, and a full queue makes room for it by refusing (429) the least "
        "urgent newest waiting item",
    )
    timeout_ms: int | None = Field(
        default=None,
        ge=1,
        le=3_600_000,
        description="This request's deadline in milliseconds (default: `X-Request-Timeout-Ms`): work still "
        "waiting then is never computed (504 deadline_exceeded); a generation running then ends with "
        "finish_reason deadline",
    )

    def scheduled(self, meta: RequestMeta) -> RequestMeta:
        """The request's metadata with this body's priority and deadline, for the core's queues."""
        return meta.with_body(
            CLASSES[self.priority] if self.priority is not None else None,
            self.timeout_ms / 1000 if self.timeout_ms is not None else None,
        )


class Truncating(BaseModel):
    """What becomes of a text longer than the model's window (TEI's fields): by default it is cut at its end
    and flagged ``truncated``."""

    truncate: bool | None = Field(
        default=None,
        description="true or null (the default): a text longer than the model's window is cut to it and "
        "flagged `truncated`; false: such a text is refused (422 naming it), as TEI answers",
    )
    truncation_direction: Literal["left", "right"] = Field(
        default="right", description="right: the text's end is cut (the default); left: its start is"
    )

    @property
    def truncation(self) -> Truncation:
        if self.truncate is None and self.truncation_direction == "right":
            return CUT_RIGHT
        return Truncation(self.truncate is not False, self.truncation_direction)

    def text_only(self, task: str) -> None:
        """A task that does not cut texts to one window (images, QA's sliding windows) refuses the fields."""
        for name in ("truncate", "truncation_direction"):
            if name in self.model_fields_set:
                raise PydanticCustomError(
                    "wrong_task_field",
                    "{name} applies to texts cut to one window, not to {task}",
                    {"name": name, "task": task, "field": name},
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
    def inputs(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])

    def field_names(self) -> FieldNames:
        """The core's parameter names as this request's fields, for its errors."""
        return one_or_many("text", "texts", self.text is not None)


class UsageOut(BaseModel):
    input_tokens: int = Field(description="Tokens fed to the model (images: patches + [CLS])")
    output_tokens: int = Field(description="Tokens generated (translation, generation); 0 otherwise")
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> UsageOut:
        return cls.model_validate(usage, from_attributes=True)


class InferenceResponse(BaseModel):
    model: str
    model_version: str = Field(description="Content hash of the model's files")
    cached: bool = Field(description="Answered from the response cache")
    usage: UsageOut
