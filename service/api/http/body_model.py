"""What every JSON request body's pydantic model shares: a boolean is never a number.

pydantic's lax mode reads ``true`` as 1 for an ``int`` field and 1.0 for a ``float`` one, so
``"max_new_tokens": true`` asked for one token. JSON keeps the two apart, and so do we: a body model
that derives from ``NoBooleanNumbers`` refuses a boolean (alone, or inside a list or an object)
wherever its field takes numbers and not booleans, with a 422 naming the field. The fields are read
off each model's annotations once, so a numeric field added later is covered without a word.
Numbers that reach the inference core from elsewhere (v2 and gRPC parameters) meet the same rule in
its ranges (``inference/params.py``).
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from pydantic import BaseModel, model_validator
from pydantic_core import PydanticCustomError


def _leaf_types(annotation: Any) -> set[Any]:
    """The plain types a field's annotation admits: ``int | None`` -> {int, NoneType},
    ``Annotated[list[float], ...]`` -> {list, float}."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_leaf_types(a) for a in typing.get_args(annotation)))
    if origin is not None:  # list[int], dict[str, float]: the container and what it holds
        return {origin}.union(*(_leaf_types(a) for a in typing.get_args(annotation)))
    return {annotation}


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, list):
        return any(isinstance(v, bool) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, bool) for v in value.values())
    return False


class NoBooleanNumbers(BaseModel):
    """Mixed into a request body model: refuses booleans in its number fields (module docstring)."""

    @classmethod
    @functools.cache
    def _number_fields(cls) -> frozenset[str]:
        names = set()
        for name, info in cls.model_fields.items():
            leaves = _leaf_types(info.annotation)
            if bool not in leaves and leaves & {int, float}:
                names.add(info.alias or name)
        return frozenset(names)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in cls._number_fields():
                if name in data and _holds_bool(data[name]):
                    raise PydanticCustomError(
                        "bool_is_not_a_number", "must be a number, not a boolean", {"field": name}
                    )
        return data
