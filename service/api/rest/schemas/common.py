"""Pieces every inference schema shares: the single-or-batch text input, the response envelope, usage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from litestar.params import Body, BodyKwarg
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.json_schema import JsonSchemaMode
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.fields import FieldNames, one_or_many
from service.inference import Usage
from service.inference.params import RANGES


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank_text", "must not be empty or whitespace only")
    return value


# Length limits are configurable (MAX_TEXT_CHARS, ...) and checked by the inference core (service/inference/limits.py).
# The documented schema says "not blank" as a pattern (some non-whitespace character); the check itself stays
# `_not_blank`, so that its error keeps its own type (`blank_text`).
Text = Annotated[
    str, AfterValidator(_not_blank), WithJsonSchema({"type": "string", "minLength": 1, "pattern": r"\S"})
]
ModelName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]


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


# --- the documented request bodies ----------------------------------------------------------------


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """Replace pydantic's ``{"$ref": "#/$defs/X"}`` by X itself: the schema is embedded in the OpenAPI document."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
        return {key: _inline_refs(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline_refs(value, defs) for value in node]
    return node


def json_schema_of(model: type[BaseModel], mode: JsonSchemaMode = "validation") -> dict[str, Any]:
    """pydantic's JSON Schema of ``model``, self-contained (no ``$defs``)."""
    schema = model.model_json_schema(mode=mode)
    inlined: dict[str, Any] = _inline_refs(schema, schema.pop("$defs", {}))
    return inlined


def alternative(given: Sequence[str], absent: Sequence[str] = (), **properties: Any) -> dict[str, Any]:
    """One ``oneOf`` branch of a body: ``given`` fields present and not null, ``absent`` ones null or missing."""
    props: dict[str, Any] = {name: {"not": {"type": "null"}} for name in given}
    props.update({name: {"type": "null"} for name in absent})
    props.update(properties)
    return {"required": list(given), "properties": props}


def exactly_one_of(*fields: str) -> list[dict[str, Any]]:
    """``oneOf`` branches for `exactly_one`: one of ``fields`` is given, the others are not."""
    return [alternative([name], [other for other in fields if other != name]) for name in fields]


def json_body(model: type[BaseModel], one_of: Sequence[dict[str, Any]] = ()) -> BodyKwarg:
    """The OpenAPI schema of a JSON request body: the one pydantic validates it with.

    Litestar derives its component schema from the fields by itself and loses
    most constraints on the way (patterns, ``minimum: 0``, the ``min_length`` of
    an optional list, ``extra="forbid"``); this puts pydantic's own
    ``model_json_schema()`` in its place, plus ``one_of``: what the model
    validators check (which inputs go together), as ``oneOf`` branches.
    Cross-field rules JSON Schema cannot say (``num_return_sequences <=
    beam_size``) and the configurable limits (MAX_ITEMS, MAX_TEXT_CHARS, ...)
    stay in the field descriptions. Use it as ``Annotated[Model, json_body(Model)]``.
    """
    schema = json_schema_of(model)
    extra: dict[str, Any] = {
        "properties": schema["properties"],
        "required": schema.get("required", []),
        "additionalProperties": False,
    }
    if one_of:
        extra["oneOf"] = list(one_of)
    return Body(schema_extra=extra)
