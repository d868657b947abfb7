"""A task's contract, declared once beside its pipeline (``ModelPipeline.contract``).

It says the task's name and default model, its inputs and outputs (names,
Open Inference Protocol datatypes, shapes, and each output's value for one
result), its parameters with their ranges, and how its inputs are decoded
(texts, or image bytes). The factory and the registry read the name and the
default; the tensor doors (v2 over HTTP and gRPC) read the rest, so no door
keeps a table of tasks (KServe's ``Model`` declares its types the same way).

Shapes: ``-1`` is the batch; a name is the model's own size, read from its
manifest when served (``labels``: its label count; ``dimensions``: its
embedding size). An output with a ``labels`` axis gives, per result, a mapping
from label to number, laid out in the model's label order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from service.errors import InvalidInputError

Dim = int | str  # -1: the batch; a name: the model's own size (``labels``, ``dimensions``)


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
            raise InvalidInputError(f"must be in {self}, got {value!r}", name, "out_of_range")

    def __str__(self) -> str:
        low, high = (int(self.low), int(self.high)) if self.integer else (self.low, self.high)
        return f"{'(' if self.low_open else '['}{low}, {high}]"


MAX_LOGPROBS = 20  # vLLM's default max_logprobs

# Every numeric parameter's one range, by the core's name: the public API's (the REST schemas document
# the same numbers, the contracts' parameters and ``inference/params.py`` check against them).
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
    "min_tokens": Range(0, 2**31 - 1, integer=True),
    "logit_bias": Range(-100.0, 100.0),  # each value; the keys are token ids of the model's vocabulary
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # the Open Inference Protocol's: BYTES (UTF-8 text, image bytes, JSON), FP32, INT64
    description: str
    shape: tuple[Dim, ...] = (-1,)
    value: Callable[[Any], Any] | None = None  # an output's value for one result

    def resolved(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape with the model's own sizes in place of their names."""
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)


@dataclass(frozen=True)
class Parameter:
    """A request parameter: ``name`` is the core's; ``public`` the names clients may use (the first is
    the one errors name when the client gave none)."""

    name: str
    kind: Literal["int", "float", "bool", "string", "strings"]  # strings: one string, or a list of them
    meaning: str
    public: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return self.public or (self.name,)

    @property
    def range(self) -> Range | None:
        return RANGES.get(self.name)

    def describe(self) -> str:
        """``float [0.0, 2.0]: 0 = greedy (default 1)``: its type, range and meaning, for metadata."""
        bounds = f" {self.range}" if self.range is not None else ""
        return f"{self.kind}{bounds}: {self.meaning}"


@dataclass(frozen=True)
class TaskContract:
    task: str
    default_model: str  # the model a request that names none gets, when it is loaded
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: tuple[Parameter, ...] = ()
    decode: Literal["text", "image"] = "text"  # inputs: UTF-8 text, or PNG/JPEG bytes

    def parameter(self, public_name: str) -> Parameter | None:
        return next((p for p in self.parameters if public_name in p.names), None)


def text_input(name: str, description: str) -> TensorSpec:
    return TensorSpec(name, "BYTES", description)


CLASSIFICATION_OUTPUTS = (
    TensorSpec("label", "BYTES", "the most probable label", value=lambda c: c.label),
    TensorSpec("score", "FP32", "its probability", value=lambda c: c.score),
    TensorSpec(
        "probabilities",
        "FP32",
        "every label's probability, in the order of `labels`",
        (-1, "labels"),
        value=lambda c: {t.label: t.score for t in c.top},
    ),
)


# Every encoder task's choice of truncation (``text_inputs.Truncation``), as TEI names it.
TRUNCATION_PARAMETERS = (
    Parameter("truncate", "bool", "false: a text longer than the window is refused (default: cut, flagged)"),
    Parameter("truncation_direction", "string", "right (default: the text's end is cut) or left (its start)"),
)
