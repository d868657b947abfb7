"""The OpenAI-compatible routes' bodies: GET /v1/models is in ``system.py``; POST /v1/completions here.

Field names, defaults and ranges are OpenAI's legacy Completions API, plus vLLM's
``top_k``, ``repetition_penalty`` and ``min_tokens`` (the ``openai`` client sends those in
``extra_body``). Parameters this service cannot honour are refused with a 400
naming them (``suffix``; ``best_of`` above ``n`` while streaming), never silently
ignored; unknown fields too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, Text, json_body, json_schema_of
from service.api.http.fields import FieldNames, one_or_many
from service.api.openai.structured import StructuredFields
from service.errors import KINDS, InvalidInputError
from service.inference import SamplingParams
from service.inference.params import logit_bias
from service.inference.scheduling import priority_of_vllm
from service.metadata import RequestMeta

DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default, not the service's (the core's is 64)
DEFAULTS = SamplingParams()  # every other default: the engine's own
MAX_LOGPROBS = 20  # vLLM's default max_logprobs (OpenAI's own limit is 5)
StopString = Annotated[str, Field(min_length=1, max_length=64)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = Field(
        default=False, description="Send a last chunk with empty `choices` and the request's `usage`"
    )


def _unsupported(field: str, why: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported", "{field} is not supported: {why}", {"field": field, "why": why})


class Scheduled(BaseModel):
    """vLLM's ``priority`` extension, and this service's ``timeout_ms``."""

    priority: int | None = Field(
        default=None,
        description="vLLM's extension: below 0 the high class, 0 normal (the default), above 0 low "
        "(default: `X-Request-Priority`)",
    )
    timeout_ms: int | None = Field(
        default=None,
        ge=1,
        le=3_600_000,
        description="This request's deadline in milliseconds: work still waiting then is never computed "
        "(504); a generation running then ends (finish_reason length)",
    )

    def scheduled(self, meta: RequestMeta) -> RequestMeta:
        """The request's metadata with this body's priority and deadline, for the core's queues."""
        priority = None if self.priority is None else priority_of_vllm(self.priority, "priority")
        return meta.with_body(priority, self.timeout_ms / 1000 if self.timeout_ms is not None else None)


def check_generation_extras(body: Any, new_tokens: int) -> None:
    """``logit_bias`` keys and values, and ``min_tokens`` within the length: a 400 naming the field."""
    if body.logit_bias:
        try:
            logit_bias(body.logit_bias)
        except InvalidInputError as exc:
            raise PydanticCustomError(
                "logit_bias", "{message}", {"field": "logit_bias", "message": exc.message}
            ) from exc
    if body.min_tokens is not None and body.min_tokens > new_tokens:
        raise PydanticCustomError(
            "min_tokens",
            "min_tokens ({min}) must not exceed the completion's length ({max})",
            {"field": "min_tokens", "min": body.min_tokens, "max": new_tokens},
        )


class CompletionRequest(Scheduled, StructuredFields, NoBooleanNumbers):
    """OpenAI's ``POST /v1/completions`` body. Every prompt x ``n`` choice is one sequence in the engine's
    running batch; choice ``i`` of a seeded request samples with ``seed + i`` (as vLLM does)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = Field(description="A text-generation model's name (GET /v1/models)")
    prompt: Text | list[Text] = Field(
        description="One prompt or a list (at most MAX_ITEMS, each at most MAX_TEXT_CHARS characters); "
        "token-id prompts are not accepted"
    )
    max_tokens: int | None = Field(
        default=DEFAULT_MAX_TOKENS,
        ge=1,
        description="New tokens per choice, at most MAX_NEW_TOKENS; default (and null) 16. Also ends at the "
        "model's context (finish_reason length)",
    )
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="Default 1; 0 = greedy")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Default 1 (off)")
    n: int | None = Field(default=None, ge=1, le=128, description="Choices per prompt; default 1")
    stop: StopString | list[StopString] | None = Field(
        default=None, description="Up to 8 strings; the text ends before the first one (finish_reason stop)"
    )
    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Reproducible sampling; choice i uses seed + i"
    )
    stream: bool | None = Field(default=None, description="Answer with OpenAI's Server-Sent Events chunks")
    stream_options: StreamOptions | None = Field(default=None, description="Only with stream: true")
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LOGPROBS,
        description="Log-probabilities of each token and of the N most likely alternatives "
        "(the model's raw distribution: before temperature, penalties, top-k/top-p)",
    )
    echo: bool | None = Field(
        default=None, description="Put the prompt before the completion (with its logprobs, when asked)"
    )
    presence_penalty: float | None = Field(
        default=None, ge=-2.0, le=2.0, description="OpenAI's: minus presence x (count > 0); default 0"
    )
    frequency_penalty: float | None = Field(
        default=None, ge=-2.0, le=2.0, description="OpenAI's: minus frequency x count; default 0"
    )
    top_k: int | None = Field(default=None, ge=-1, le=1000, description="vLLM's extra; 0 or -1 = off")
    repetition_penalty: float | None = Field(
        default=None, gt=0.0, le=10.0, description="vLLM's extra (CTRL rule, prompt and output); 1 = off"
    )
    user: str | None = Field(default=None, max_length=256, description="Accepted and ignored")
    best_of: int | None = Field(
        default=None,
        ge=1,
        le=128,
        description="Sequences generated per prompt (at least n); the n of highest cumulative logprob are "
        "returned, best first; usage counts all of them. Not with stream",
    )
    suffix: str | None = Field(default=None, description="Refused: this GPT does no insertion")
    logit_bias: dict[str, float] | None = Field(
        default=None, description='{"token id": bias in [-100, 100]}, added to the logits before sampling'
    )
    min_tokens: int | None = Field(
        default=None,
        ge=0,
        description="vLLM's extra: no end of text and no stop string before this many tokens (default 0)",
    )

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise PydanticCustomError("too_short", "must hold at least one prompt", {"field": "prompt"})
        if isinstance(self.stop, list) and len(self.stop) > 8:
            raise PydanticCustomError("too_long", "at most 8 stop strings", {"field": "stop"})
        if self.suffix is not None:
            raise _unsupported("suffix", "the model only continues text")
        check_generation_extras(self, self.new_tokens)
        if self.best_of is not None and self.best_of < self.choices:
            raise PydanticCustomError(
                "best_of", "best_of must be at least n ({n})", {"field": "best_of", "n": self.choices}
            )
        if self.best_of is not None and self.best_of > self.choices and self.stream:
            raise _unsupported("best_of", "best_of above n ranks finished sequences, so it cannot stream")
        if self.stream_options is not None and not self.stream:
            raise PydanticCustomError(
                "stream_options",
                "stream_options is only allowed with stream: true",
                {"field": "stream_options"},
            )
        return self

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def field_names(self) -> FieldNames:
        """The core's names in OpenAI's words: ``prompt`` / ``prompt[i]``, ``max_tokens``."""
        return one_or_many("prompt", "prompt", isinstance(self.prompt, str), max_new_tokens="max_tokens")

    @property
    def choices(self) -> int:
        return self.n if self.n is not None else 1

    @property
    def new_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS

    def sampling_params(self) -> SamplingParams:
        """The engine's parameters for every prompt (choice ``i`` samples with ``seed + i``: the core's rule).

        OpenAI's documented defaults are mapped here explicitly (``max_tokens`` 16); every other
        parameter left out takes the engine's own default."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_new_tokens=self.new_tokens,
            temperature=DEFAULTS.temperature if self.temperature is None else self.temperature,
            top_k=max(self.top_k or DEFAULTS.top_k, 0),
            top_p=DEFAULTS.top_p if self.top_p is None else self.top_p,
            repetition_penalty=(
                DEFAULTS.repetition_penalty if self.repetition_penalty is None else self.repetition_penalty
            ),
            presence_penalty=DEFAULTS.presence_penalty
            if self.presence_penalty is None
            else self.presence_penalty,
            frequency_penalty=(
                DEFAULTS.frequency_penalty if self.frequency_penalty is None else self.frequency_penalty
            ),
            stop=tuple(stop),
            seed=self.seed,
            logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo else None,
            logit_bias=logit_bias(self.logit_bias) if self.logit_bias else (),
            min_tokens=self.min_tokens or 0,
            structured_outputs=self.structured(),
        )


CompletionBody = Annotated[CompletionRequest, json_body(CompletionRequest)]


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy logprobs: one entry per token of the choice's text (the prompt's first with echo)."""

    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="None for the prompt's first token (echo)")
    top_logprobs: list[dict[str, float] | None] = Field(description="The `logprobs` most likely tokens")
    text_offset: list[int] = Field(description="Each token's character offset in the choice's text")


class CompletionChoice(BaseModel):
    index: int = Field(description="prompt index x n + choice")
    text: str
    finish_reason: Literal["stop", "length"] | None = Field(
        description="stop: end of text or a stop string; length: max_tokens or the model's context; "
        "null in a stream's chunks before the last of the choice"
    )
    logprobs: CompletionLogprobs | None = None


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """The answer, and (with stream: true) each ``data:`` chunk, whose ``usage`` is null but in the last
    chunk of ``stream_options.include_usage`` (with empty ``choices``)."""

    id: str = Field(description="cmpl-...")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(description="Unix seconds")
    model: str
    system_fingerprint: str | None = Field(default=None, description="The model's version (content hash)")
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


def chunk_schema() -> dict[str, Any]:
    """One ``data:`` event of a streamed completion, for the OpenAPI document."""
    return {
        "description": "Server-Sent Events `data: {chunk}` (a CompletionResponse without usage, one per "
        "token and choice), then `data: [DONE]`; no `event:` lines",
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": json_schema_of(CompletionResponse, mode="serialization"),
    }


# --- errors: {"error": {message, type, param, code}} ---------------------------------------------------


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="OpenAI's class of error: invalid_request_error | authentication_error | "
        "rate_limit_error | server_error"
    )
    param: str | None = Field(default=None, description="The (first) request field at fault")
    code: str | None = Field(default=None, description="This service's error kind: " + " | ".join(KINDS))


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail
