"""POST /v1/generate (JSON, or Server-Sent Events with ``stream: true``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.error_body import ErrorBody
from service.api.rest.schemas.common import (
    InferenceResponse,
    Request,
    Text,
    alternative,
    exactly_one,
    json_body,
    json_schema_of,
)
from service.engine.sampling import SamplingParams
from service.pipelines.results import Generation

DEFAULT_MAX_NEW_TOKENS = 64
StopString = Annotated[str, Field(min_length=1, max_length=64)]


class GenerateRequest(Request):
    prompt: Text | None = Field(default=None, description="One prompt (at most MAX_TEXT_CHARS characters)")
    prompts: list[Text] | None = Field(
        None, min_length=1, description="A batch of prompts (at most MAX_ITEMS), decoded concurrently"
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="At most MAX_NEW_TOKENS; default 64 (capped by MAX_NEW_TOKENS). Generation also "
        "ends at the model's context length (finish_reason length)",
    )
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_k: int = Field(default=0, ge=0, le=1000, description="0 = off")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="1 = off")
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0, description="1 = off (CTRL rule)")
    stop: list[StopString] = Field(
        default_factory=list, max_length=8, description="Generation ends before the first stop string"
    )
    seed: int | None = Field(
        None, ge=0, le=2**63 - 1, description="Reproducible sampling, whatever shares the batch"
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
    def input_field(self) -> str:
        return "prompt" if self.prompt is not None else "prompts"

    def fields_and_prompts(self) -> list[tuple[str, str]]:
        if self.prompt is not None:
            return [("prompt", self.prompt)]
        return [(f"prompts[{i}]", p) for i, p in enumerate(self.prompts or [])]

    def sampling_params(self, max_new_tokens_cap: int) -> SamplingParams:
        """The engine's parameters for every prompt of this request (the default length within the cap)."""
        default = min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_cap)
        return SamplingParams(
            max_new_tokens=self.max_new_tokens if self.max_new_tokens is not None else default,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            stop=tuple(self.stop),
            seed=self.seed,
        )


GenerateBody = Annotated[
    GenerateRequest,
    json_body(
        GenerateRequest,
        [alternative(["prompt"], ["prompts"]), alternative(["prompts"], ["prompt"], stream={"const": False})],
    ),
]


class GenerationOut(BaseModel):
    text: str = Field(description="The completion (without the prompt; cut before a stop string)")
    finish_reason: str = Field(description="length | stop | eos")
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, g: Generation) -> GenerationOut:
        return cls(
            text=g.text,
            finish_reason=g.finish_reason,
            prompt_tokens=g.prompt_tokens,
            completion_tokens=g.completion_tokens,
        )


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
