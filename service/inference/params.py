"""Decoding and sampling parameters from a door's raw values: each checked against its one range, here.

A door passes what its client sent (None or absent: the default); the result is
the engine's ``SamplingParams`` or the translator's ``DecodingParams``, or an
``InvalidInputError`` naming the core's parameter (``temperature``, ``beam_size``,
``stop``...), which the door renames. The ranges are the public API's: the REST
schemas document the same numbers (``RANGES``, in ``pipelines/contract.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from service.engine.sampling import SamplingParams
from service.errors import InvalidInputError
from service.pipelines.contract import RANGES
from service.pipelines.translate import DecodingParams

MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 64


def _checked(given: Mapping[str, Any], allowed: set[str]) -> dict[str, Any]:
    values = {}
    for name, value in given.items():
        assert name in allowed, f"not a parameter: {name}"
        if value is None:
            continue
        if name in RANGES:
            RANGES[name].check(name, value)
            value = int(value) if RANGES[name].integer else float(value)
        values[name] = value
    return values


def _stop(value: Any) -> tuple[str, ...]:
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) for s in strings):
        raise InvalidInputError("must be a string or a list of strings", "stop", "type_error")
    if len(strings) > MAX_STOP_STRINGS:
        raise InvalidInputError(f"at most {MAX_STOP_STRINGS} stop strings", "stop", "too_long")
    for s in strings:
        if not 1 <= len(s) <= MAX_STOP_CHARS:
            raise InvalidInputError(
                f"each stop string has 1..{MAX_STOP_CHARS} characters", "stop", "too_long"
            )
    return tuple(strings)


def sampling_params(**given: Any) -> SamplingParams:
    """``SamplingParams`` from raw values; ``max_new_tokens`` None: the core's default length."""
    allowed = {f.name for f in fields(SamplingParams)}
    stop = given.pop("stop", None)
    greedy = given.pop("greedy", None)
    values = _checked(given, allowed)
    if stop is not None:
        values["stop"] = _stop(stop)
    if greedy is not None:
        values["greedy"] = bool(greedy)
    return SamplingParams(**values)


def decoding_params(**given: Any) -> DecodingParams:
    """``DecodingParams`` (translation) from raw values; ``max_new_tokens`` None: the per-source default."""
    values = _checked(given, {f.name for f in fields(DecodingParams)})
    beams, returns = values.get("beam_size", 1), values.get("num_return_sequences", 1)
    if returns > beams:
        raise InvalidInputError(
            f"num_return_sequences ({returns}) must not exceed beam_size ({beams})",
            "num_return_sequences",
            "out_of_range",
        )
    return DecodingParams(**values)
