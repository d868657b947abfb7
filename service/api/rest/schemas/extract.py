"""POST /v1/extract: ``task: "qa"`` (question + context) or ``task: "entities"`` (text)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_schema import Text, alternative, json_body
from service.api.http.fields import FieldNames, one_or_many
from service.api.rest.schemas.attention import AttentionFields, AttentionOut, WithAttention
from service.api.rest.schemas.common import InferenceResponse, Request, Truncating, exactly_one
from service.inference import Answer, Entities


class QAPair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Text = Field(description="At most MAX_TEXT_CHARS characters")
    context: Text = Field(description="At most MAX_CONTEXT_CHARS characters; long ones use a sliding window")


class ExtractRequest(Request, AttentionFields, Truncating):
    """One schema for both tasks; fields that belong to the other task are rejected, naming them.

    qa: ``question`` + ``context`` (one pair) or ``items`` (a batch of pairs).
    entities: ``text`` or ``texts``.
    """

    task: Literal["qa", "entities"]
    question: Text | None = None
    context: Text | None = None
    items: list[QAPair] | None = Field(
        default=None, min_length=1, description="qa: a batch of {question, context}"
    )
    text: Text | None = Field(default=None, description="entities: one text")
    texts: list[Text] | None = Field(default=None, min_length=1, description="entities: a batch of texts")
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = Field(
        default=None,
        description="entities: how tokens' tags become entities, as transformers' pipeline defines it (none: "
        "every token with its full tag; simple: runs of tokens; first/average/max: a word's tag from its first "
        "sub-token, their mean probabilities or its most confident one); default: the model's own (first for "
        "the house tagger, simple for imported ones)",
    )
    ignore_labels: list[str] | None = Field(
        default=None,
        max_length=64,
        description='entities: labels left out of the answer (default ["O"]; with either field, the '
        "grouping is transformers' own)",
    )

    @model_validator(mode="after")
    def _fields_fit_the_task(self) -> ExtractRequest:
        qa_fields = ("question", "context", "items")
        if self.task == "qa":
            for name in ("aggregation_strategy", "ignore_labels"):
                if getattr(self, name) is not None:
                    raise PydanticCustomError(
                        "wrong_task_field",
                        "{name} does not belong to task {task}",
                        {"name": name, "task": self.task, "field": name},
                    )
        other = qa_fields if self.task == "entities" else ("text", "texts")
        for name in other:
            if getattr(self, name) is not None:
                raise PydanticCustomError(
                    "wrong_task_field",
                    "{name} does not belong to task {task}",
                    {"name": name, "task": self.task, "field": name},
                )
        if self.task == "entities":
            exactly_one({"text": self.text, "texts": self.texts}, "text", "texts")
            return self
        self.text_only("qa (its contexts are read in sliding windows)")
        single = self.question is not None or self.context is not None
        if single and self.items is not None:
            raise PydanticCustomError(
                "one_input", "give question + context, or items, not both", {"field": "items"}
            )
        if not single and self.items is None:
            raise PydanticCustomError("one_input", "give question + context, or items", {"field": "question"})
        for name in ("question", "context"):
            if single and getattr(self, name) is None:
                raise PydanticCustomError(
                    "missing", "{name} is required with task qa", {"name": name, "field": name}
                )
        return self

    @property
    def inputs(self) -> list[str]:
        """entities: the texts."""
        return [self.text] if self.text is not None else list(self.texts or [])

    def pairs(self) -> list[tuple[str, str]]:
        """qa: (question, context) per pair."""
        if self.items is not None:
            return [(p.question, p.context) for p in self.items]
        assert self.question is not None and self.context is not None
        return [(self.question, self.context)]

    def field_names(self) -> FieldNames:
        if self.task == "entities":
            return one_or_many("text", "texts", self.text is not None)
        if self.items is not None:
            return FieldNames(
                {"inputs": "items[{i}].question", "contexts": "items[{i}].context"}, {"inputs": "items"}
            )
        return FieldNames(
            {"inputs": "question", "contexts": "context"}, {"inputs": "context", "contexts": "context"}
        )


_INPUTS = ("question", "context", "items", "text", "texts")


def _task_input(task: str, *given: str) -> dict[str, object]:
    return alternative(given, [name for name in _INPUTS if name not in given], task={"const": task})


ExtractBody = Annotated[
    ExtractRequest,
    json_body(
        ExtractRequest,
        [
            _task_input("qa", "question", "context"),
            _task_input("qa", "items"),
            _task_input("entities", "text"),
            _task_input("entities", "texts"),
        ],
    ),
]


class AnswerOut(WithAttention):
    answer: str = Field(description="context[start:end]; empty when the context held no usable token")
    start: int = Field(description="Character offset into the context (Python string index)")
    end: int
    score: float = Field(description="p(start) x p(end) within the window the span came from")
    window: int | None = Field(description="Index of the sliding window the span came from")
    windows: int = Field(description="How many windows the context was cut into")

    @classmethod
    def of(cls, a: Answer) -> AnswerOut:
        return cls.model_validate({**vars(a), "attention": AttentionOut.of(a.attention)})


class EntityOut(BaseModel):
    text: str = Field(description="input[start:end]")
    label: str = Field(description="PER, ORG, LOC, MISC (the tag set without B-/I-)")
    start: int
    end: int
    score: float = Field(description="Mean probability of the entity's word tags")


class EntitiesOut(WithAttention):
    entities: list[EntityOut]
    truncated: bool = Field(description="Words beyond the model's window were not tagged")

    @classmethod
    def of(cls, e: Entities) -> EntitiesOut:
        spans = [
            EntityOut(text=s.text, label=s.label, start=s.start, end=s.end, score=s.score) for s in e.entities
        ]
        return cls(entities=spans, truncated=e.truncated, attention=AttentionOut.of(e.attention))


class ExtractResponse(InferenceResponse):
    task: Literal["qa", "entities"]
    results: list[AnswerOut] | list[EntitiesOut] = Field(
        description="AnswerOut for qa, EntitiesOut for entities"
    )
