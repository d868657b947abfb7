"""Structured output on the OpenAI door: OpenAI's ``response_format``, and vLLM's ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar`` and ``structured_outputs`` (the ``openai`` client
sends vLLM's in ``extra_body``). At most one of them per request; each becomes the core's
``StructuredOutput``, naming the field the client used in any error about it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.structured import MAX_CHOICES, StructuredOutputs
from service.inference import StructuredOutput


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema. ``strict`` is accepted: the schema is always
    enforced (every token is masked by it)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, description="The schema's name (OpenAI requires one)")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON schema the output follows")
    strict: bool | None = Field(default=None, description="Accepted; the schema is always enforced")


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object) or
    ``json_schema``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise PydanticCustomError(
                "response_format",
                "json_schema is given with type json_schema, and only then",
                {"field": "response_format.json_schema"},
            )
        return self


class StructuredFields(BaseModel):
    """The constraint fields both OpenAI generation routes take."""

    response_format: ResponseFormat | None = Field(
        default=None, description="OpenAI's: text, json_object or json_schema (enforced token by token)"
    )
    guided_json: dict[str, Any] | str | None = Field(default=None, description="vLLM's extra: a JSON schema")
    guided_regex: str | None = Field(default=None, min_length=1, description="vLLM's extra: a regex")
    guided_choice: list[str] | None = Field(
        default=None, min_length=1, max_length=MAX_CHOICES, description="vLLM's extra: one of these strings"
    )
    guided_grammar: str | None = Field(
        default=None, min_length=1, description="vLLM's extra: a Lark grammar (llguidance's dialect)"
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None, description="vLLM's extra: {json | regex | choice | grammar | json_object}"
    )

    @model_validator(mode="after")
    def _at_most_one(self) -> StructuredFields:
        given = [
            name
            for name in (
                "guided_json",
                "guided_regex",
                "guided_choice",
                "guided_grammar",
                "structured_outputs",
            )
            if getattr(self, name) is not None
        ]
        if self.response_format is not None and self.response_format.type != "text":
            given.insert(0, "response_format")
        if len(given) > 1:
            raise PydanticCustomError(
                "structured_outputs",
                "at most one constraint per request: {given}",
                {"field": given[1], "given": ", ".join(given)},
            )
        return self

    def structured(self) -> StructuredOutput | None:
        """The request's constraint for the core, or None."""
        rf = self.response_format
        if rf is not None and rf.json_schema is not None:
            return StructuredOutput.json_schema(rf.json_schema.schema_, "response_format.json_schema.schema")
        if rf is not None and rf.type == "json_object":
            return StructuredOutput("json_object", "", "response_format")
        if self.guided_json is not None:
            return StructuredOutput.json_schema(self.guided_json, "guided_json")
        if self.guided_regex is not None:
            return StructuredOutput("regex", self.guided_regex, "guided_regex")
        if self.guided_choice is not None:
            return StructuredOutput.choice(self.guided_choice, "guided_choice")
        if self.guided_grammar is not None:
            return StructuredOutput("grammar", self.guided_grammar, "guided_grammar")
        if self.structured_outputs is not None:
            return self.structured_outputs.constraint("structured_outputs")
        return None
