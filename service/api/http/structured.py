"""Structured output as the HTTP doors take it: vLLM's ``structured_outputs`` object, shared by the REST
route and the OpenAI door (which also reads OpenAI's ``response_format`` and vLLM's ``guided_*`` fields).

One constraint per request: a JSON schema, any JSON object, a regular expression, one of several strings,
or a Lark grammar. Whether it compiles is the core's check (a 400 / 422 naming the field the client used).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.inference import MAX_CHOICES, StructuredOutput


class StructuredOutputs(BaseModel):
    """vLLM's ``StructuredOutputsParams``: exactly one of its fields."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(
        default=None, alias="json", description="A JSON schema (an object, or its JSON text)"
    )
    regex: str | None = Field(
        default=None, min_length=1, description="A regular expression (Rust regex syntax)"
    )
    choice: list[str] | None = Field(
        default=None, min_length=1, max_length=MAX_CHOICES, description="The text is exactly one of these"
    )
    grammar: str | None = Field(
        default=None, min_length=1, description="A Lark grammar (llguidance's dialect)"
    )
    json_object: bool | None = Field(default=None, description="true: any JSON object")

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputs:
        given = [
            name for name in ("json", "regex", "choice", "grammar") if getattr(self, _attr(name)) is not None
        ]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise PydanticCustomError(
                "structured_outputs",
                "give exactly one of json, regex, choice, grammar, json_object (got {given})",
                {"field": "structured_outputs", "given": ", ".join(given) or "none"},
            )
        return self

    def constraint(self, field: str) -> StructuredOutput:
        """The core's constraint; ``field`` is what errors about it name (``structured_outputs``)."""
        if self.json_ is not None:
            return StructuredOutput.json_schema(self.json_, f"{field}.json")
        if self.regex is not None:
            return StructuredOutput("regex", self.regex, f"{field}.regex")
        if self.choice is not None:
            return StructuredOutput.choice(self.choice, f"{field}.choice")
        if self.grammar is not None:
            return StructuredOutput("grammar", self.grammar, f"{field}.grammar")
        return StructuredOutput("json_object", "", f"{field}.json_object")


def _attr(name: str) -> str:
    return "json_" if name == "json" else name
