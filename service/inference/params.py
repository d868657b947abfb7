"""Decoding and sampling parameters from a door's raw values: each checked against its one range, here.

A door passes what its client sent (None or absent: the default); the result is
the engine's ``SamplingParams`` or the translator's ``DecodingParams``, or an
``InvalidInputError`` naming the core's parameter (``temperature``, ``beam_size``,
``stop``...), which the door renames. The ranges are the public API's: the REST
schemas document the same numbers (``RANGES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from service.engine.sampling import SamplingParams
from service.errors import InvalidInputError
from service.pipelines.translate import DecodingParams

MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 64
MAX_LOGPROBS = 20  # vLLM's default max_logprobs


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False  # low itself is out
    integer: bool = False

    def check(self, name: str, value: Any) -> None:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # an int is whole however large (float() of one past 1e308 would overflow)
        if not number or (self.integer and not isinstance(value, int) and not float(value).is_integer()):
            kind = "an integer" if self.integer else "a number"
            raise InvalidInputError(f"must be {kind}, got {value!r}", name, "type_error")
        # NaN compares false with everything, so it would pass both bounds: refuse it first (gRPC's
        # double parameters can carry it; JSON cannot)
        nan = isinstance(value, float) and math.isnan(value)
        too_low = value <= self.low if self.low_open else value < self.low
        if nan or too_low or value > self.high:
            opening = "(" if self.low_open else "["
            low, high = (int(self.low), int(self.high)) if self.integer else (self.low, self.high)
            raise InvalidInputError(
                f"must be in {opening}{low}, {high}], got {value!r}", name, "out_of_range"
            )


RANGES: dict[str, Range] = {
    "max_new_tokens": Range(1, 2**31 - 1, integer=True),  # MAX_NEW_TOKENS is the request limit
    "temperature": Range(0.0, 2.0),
    "top_k": Range(0, 1000, integer=True),
    "top_p": Range(0.0, 1.0, low_open=True),
    "repetition_penalty": Range(0.0, 10.0, low_open=True),
    "presence_penalty": Range(-2.0, 2.0),
    "frequency_penalty": Range(-2.0, 2.0),
    "seed": Range(0, 2**63 - 1, integer=True),
    "logprobs": Range(0, MAX_LOGPROBS, integer=True),
    "prompt_logprobs": Range(0, MAX_LOGPROBS, integer=True),
    "beam_size": Range(1, 8, integer=True),
    "num_return_sequences": Range(1, 8, integer=True),
    "length_penalty": Range(0.0, 5.0),
}


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
