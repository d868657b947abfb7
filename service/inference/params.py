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
from service.engine.structured_output import StructuredOutput
from service.errors import InvalidInputError
from service.inference.scheduling import shown, whole_number
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
        if name == "logit_bias":
            values[name] = logit_bias(value)
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


def logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``, ``{"token id": bias}`` (JSON keys are strings), as (id, bias) pairs in id
    order; each bias in [-100, 100]. Whether the ids are the model's is the pipeline's check."""
    if not isinstance(value, Mapping):
        raise InvalidInputError("must be an object of token id -> bias", "logit_bias", "type_error")
    pairs: dict[int, float] = {}
    for key, bias in value.items():
        token = None if isinstance(key, bool) else whole_number(str(key))  # the header parser's rule
        if token is None:
            raise InvalidInputError(
                f"keys are token ids (ASCII digits, non-negative), got {shown(str(key))}",
                "logit_bias",
                "type_error",
            )
        if token in pairs:
            raise InvalidInputError(f"token {token} is biased twice", "logit_bias", "duplicate")
        RANGES["logit_bias"].check("logit_bias", bias)
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_output(given: Mapping[str, Any]) -> StructuredOutput | None:
    """vLLM's ``guided_*`` parameters (at most one) as the engine's constraint, naming its parameter."""
    named = [(name, given[name]) for name in GUIDED if given.get(name) is not None]
    if len(named) > 1:
        raise InvalidInputError(
            f"at most one constraint per request: {', '.join(n for n, _ in named)}", named[1][0], "conflict"
        )
    if not named:
        return None
    name, value = named[0]
    if name == "guided_choice":
        choices = [value] if isinstance(value, str) else value
        if (
            not isinstance(choices, (list, tuple))
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise InvalidInputError("must be a string or a list of strings", name, "type_error")
        return StructuredOutput.choice(choices, name)
    if not isinstance(value, str) or not value:
        raise InvalidInputError("must be a non-empty string", name, "type_error")
    kind = {"guided_json": "json", "guided_regex": "regex", "guided_grammar": "grammar"}[name]
    return StructuredOutput(kind, value, name)  # type: ignore[arg-type]


def sampling_params(**given: Any) -> SamplingParams:
    """``SamplingParams`` from raw values; ``max_new_tokens`` None: the core's default length; vLLM's
    ``guided_*`` parameters as its ``structured_outputs``."""
    allowed = {f.name for f in fields(SamplingParams)}
    stop = given.pop("stop", None)
    greedy = given.pop("greedy", None)
    structured = structured_output({name: given.pop(name, None) for name in GUIDED})
    values = _checked(given, allowed)
    if structured is not None:
        values["structured_outputs"] = structured
    if stop is not None:
        values["stop"] = _stop(stop)
    if greedy is not None:
        values["greedy"] = bool(greedy)
    limit, least = values.get("max_new_tokens"), values.get("min_tokens", 0)
    if limit is not None and least > limit:
        raise InvalidInputError(
            f"min_tokens ({least}) must not exceed max_new_tokens ({limit})", "min_tokens", "out_of_range"
        )
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
