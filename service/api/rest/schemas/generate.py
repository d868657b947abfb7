"""POST /v1/generate (JSON, or Server-Sent Events with ``stream: true``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_schema import Text, alternative, json_body, json_schema_of
from service.api.http.error_body import ErrorBody
from service.api.http.fields import FieldNames, one_or_many
from service.api.http.structured import StructuredOutputs
from service.api.rest.schemas.common import InferenceResponse, Request, exactly_one, ranged
from service.inference import DEFAULT_MAX_NEW_TOKENS, Generation, SamplingParams
from service.inference.params import MAX_STOP_CHARS, MAX_STOP_STRINGS, sampling_params

DEFAULTS = SamplingParams()  # the engine's defaults, written once there
_SAMPLING = {
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "stop",
    "seed",
    "min_tokens",
    "logit_bias",
}
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class GenerateRequest(Request):
    prompt: Text | None = Field(default=None, description="One prompt (at most MAX_TEXT_CHARS characters)")
    prompts: list[Text] | None = Field(
        None, min_length=1, description="A batch of prompts (at most MAX_ITEMS), decoded concurrently"
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description=f"At most MAX_NEW_TOKENS; default {DEFAULT_MAX_NEW_TOKENS} (capped by MAX_NEW_TOKENS). Generation also "
        "ends at the model's context length (finish_reason length)",
    )
    temperature: float = ranged("temperature", DEFAULTS.temperature, "0 = greedy")
    top_k: int = ranged("top_k", DEFAULTS.top_k, "0 = off")
    top_p: float = ranged("top_p", DEFAULTS.top_p, "1 = off")
    repetition_penalty: float = ranged(
        "repetition_penalty", DEFAULTS.repetition_penalty, "1 = off (CTRL rule)"
    )
    stop: list[StopString] = Field(
        default_factory=list,
        max_length=MAX_STOP_STRINGS,
        description="Generation ends before the first stop string",
    )
    seed: int | None = ranged("seed", None, "Reproducible sampling, whatever shares the batch")
    min_tokens: int = ranged(
        "min_tokens", DEFAULTS.min_tokens, "No end of text or stop string before this many"
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None,
        description="Keep the text inside one constraint (vLLM's): {json: schema} | {regex} | {choice: [..]} | "
        "{grammar: lark} | {json_object: true}; one that does not compile is a 422 naming it",
    )
    logit_bias: dict[str, float] | None = Field(
        default=None,
        description='{"token id": bias in [-100, 100]}, added to the logits before sampling (OpenAI\'s)',
    )
    stream: bool = Field(default=False, description="Answer with Server-Sent Events (single prompt only)")

    @model_validator(mode="after")
    def _check(self) -> GenerateRequest:
        exactly_one({"prompt": self.prompt, "prompts": self.prompts}, "prompt", "prompts")
        if self.stream and self.prompts is not None:
            raise PydanticCustomError(
                "stream_batch", "stream takes a single prompt, not prompts", {"field": "stream"}
            )
        return self

    @property
    def prompts_given(self) -> list[str]:
        return [self.prompt] if self.prompt is not None else list(self.prompts or [])

    def field_names(self) -> FieldNames:
        return one_or_many("prompt", "prompts", self.prompt is not None)

    def sampling_params(self) -> SamplingParams:
        """The engine's parameters for every prompt of this request (no length: the core's default)."""
        params = sampling_params(**self.model_dump(include=_SAMPLING))
        if self.structured_outputs is None:
            return params
        return replace(params, structured_outputs=self.structured_outputs.constraint("structured_outputs"))


GenerateBody = Annotated[
    GenerateRequest,
    json_body(
        GenerateRequest,
        [alternative(["prompt"], ["prompts"]), alternative(["prompts"], ["prompt"], stream={"const": False})],
    ),
]


class GenerationOut(BaseModel):
    text: str = Field(description="The completion (without the prompt; cut before a stop string)")
    finish_reason: str = Field(
        description="length | stop | eos | deadline (the request's timeout_ms passed while it decoded)"
    )
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, g: Generation) -> GenerationOut:
        return cls.model_validate(g, from_attributes=True)


class GenerateResponse(InferenceResponse):
    results: list[GenerationOut]


class TokenEventOut(BaseModel):
    """SSE ``event: token`` data."""

    index: int = Field(description="0-based position in the completion")
    token_id: int
    text: str = Field(
        description="Text this token adds (may be empty mid-character); concatenated = the result"
    )


class DoneEventOut(BaseModel):
    """SSE ``event: done`` data: the final event of a stream."""

    model: str
    model_version: str
    finish_reason: str
    text: str
    usage: dict[str, int]


def _sse_event(event: str, data: type[BaseModel]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"const": event},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": json_schema_of(data, mode="serialization"),
            },
        },
    }


SSE_EVENT_SCHEMA: dict[str, Any] = {
    "description": "One Server-Sent Event ({event, data}): `token` per token, then `done`, or `error` if "
    "decoding fails mid-stream; `data` is JSON",
    "oneOf": [
        _sse_event("token", TokenEventOut),
        _sse_event("done", DoneEventOut),
        _sse_event("error", ErrorBody),
    ],
}
"""The schema of each event of a streamed generation (what OpenAPI 3.2 calls the ``itemSchema``)."""
