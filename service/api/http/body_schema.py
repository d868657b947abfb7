"""The request bodies' shared vocabulary: the field types every door's bodies use, and their documented schema.

``Text`` and ``ModelName`` are the fields each door's bodies share; ``json_body`` puts pydantic's own JSON
Schema of a body model in the OpenAPI document (with ``oneOf`` branches for which inputs go together).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from litestar.params import Body, BodyKwarg
from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema
from pydantic.json_schema import JsonSchemaMode
from pydantic_core import PydanticCustomError


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
# A model's name, optionally with the version to serve it: ``name@2`` (its version folder) or
# ``name@<content hash>`` (the model_version answers carry); without one, the newest version.
ModelName = Annotated[str, Field(min_length=1, max_length=160, pattern=r"^[A-Za-z0-9._-]+(@[A-Za-z0-9]+)?$")]


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
