"""POST /v1/chat/completions: OpenAI's Chat Completions bodies, chunks and logprobs, with vLLM's extras.

The messages become one prompt by the model's chat template (the core renders it); the rest is the
completions route's: the same engine, sampling, structured output, limits and errors. Fields this service
cannot honour are refused with a 400 naming them (``tools``, ``tool_choice``, ``functions``, a message
part that is not text), never silently ignored; unknown fields too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.http.body_model import NoBooleanNumbers
from service.api.http.body_schema import ModelName, json_body, json_schema_of
from service.api.http.fields import FieldNames
from service.api.openai.schemas import (
    DEFAULTS,
    MAX_LOGPROBS,
    CompletionUsage,
    Scheduled,
    StopString,
    StreamOptions,
    check_generation_extras,
)
from service.api.openai.structured import StructuredFields
from service.inference import SamplingParams
from service.inference.params import logit_bias

MAX_MESSAGES = 256
MAX_MESSAGE_CHARS = 65_536  # each text part; the rendered prompt is held to MAX_TEXT_CHARS by the core


class TextPart(BaseModel):
    """A content part; only text is taken (this GPT reads no images or audio)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str = Field(max_length=MAX_MESSAGE_CHARS)


class ChatMessage(BaseModel):
    """One message: ``content`` a string or text parts (joined with newlines, as vLLM renders them for a
    template that reads strings). Tool calls are not taken."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=64)

    def for_template(self) -> dict[str, Any]:
        content = self.content
        text = content if content is None or isinstance(content, str) else "\n".join(p.text for p in content)
        message: dict[str, Any] = {"role": self.role, "content": text}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(Scheduled, StructuredFields, NoBooleanNumbers):
    """OpenAI's ``POST /v1/chat/completions`` body, plus vLLM's sampling and template extras."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = Field(description="A text-generation model with a chat template (GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES, description="The conversation")
    max_completion_tokens: int | None = Field(
        default=None,
        ge=1,
        description="New tokens per choice, at most MAX_NEW_TOKENS; default the service's (64)",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="Deprecated by OpenAI: max_completion_tokens"
    )
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="Default 1; 0 = greedy")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Default 1 (off)")
    n: int | None = Field(default=None, ge=1, le=128, description="Choices; default 1")
    stop: StopString | list[StopString] | None = Field(default=None, description="Up to 8 strings")
    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Reproducible; choice i uses seed + i"
    )
    stream: bool | None = Field(default=None, description="Answer with chat.completion.chunk events")
    stream_options: StreamOptions | None = Field(default=None, description="Only with stream: true")
    logprobs: bool | None = Field(
        default=None, description="Each token's log-probability (the model's raw one)"
    )
    top_logprobs: int | None = Field(
        default=None, ge=0, le=MAX_LOGPROBS, description="With logprobs: the N most likely alternatives"
    )
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, description='{"token id": bias in [-100, 100]}')
    user: str | None = Field(default=None, max_length=256, description="Accepted and ignored")
    top_k: int | None = Field(default=None, ge=-1, le=1000, description="vLLM's extra; 0 or -1 = off")
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0, description="vLLM's extra")
    min_tokens: int | None = Field(default=None, ge=0, description="vLLM's extra: no end before this many")
    add_generation_prompt: bool = Field(
        default=True,
        description="vLLM's extra: end the prompt with the assistant's turn (the template's own)",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="vLLM's extra: more template variables; one the template never reads is a 400",
    )
    tools: list[dict[str, Any]] | None = Field(default=None, description="Refused: no tool calling")
    tool_choice: Any = Field(default=None, description="Refused: no tool calling")
    parallel_tool_calls: bool | None = Field(default=None, description="Accepted and ignored without tools")

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if isinstance(self.stop, list) and len(self.stop) > 8:
            raise PydanticCustomError("too_long", "at most 8 stop strings", {"field": "stop"})
        for name in ("tools", "tool_choice"):
            if getattr(self, name) not in (None, [], "none"):
                raise PydanticCustomError(
                    "unsupported", "{field} is not supported: no tool calling", {"field": name}
                )
        if self.top_logprobs is not None and not self.logprobs:
            raise PydanticCustomError(
                "top_logprobs", "top_logprobs needs logprobs: true", {"field": "top_logprobs"}
            )
        if self.stream_options is not None and not self.stream:
            raise PydanticCustomError(
                "stream_options",
                "stream_options is only allowed with stream: true",
                {"field": "stream_options"},
            )
        check_generation_extras(self, self.new_tokens or 2**31 - 1)
        return self

    @property
    def new_tokens(self) -> int | None:
        """``max_completion_tokens``, else the deprecated ``max_tokens``; None: the core's default."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def choices(self) -> int:
        return self.n if self.n is not None else 1

    def field_names(self) -> FieldNames:
        """The core's names in this route's words: the rendered prompt is ``messages``."""
        length = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
        return FieldNames({"inputs": "messages"}, {"inputs": "messages", "max_new_tokens": length})

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]

    def sampling_params(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        top_n = (self.top_logprobs or 0) if self.logprobs else None

        def given(value: Any, default: Any) -> Any:
            return default if value is None else value

        return SamplingParams(
            max_new_tokens=self.new_tokens,
            temperature=given(self.temperature, DEFAULTS.temperature),
            top_k=max(self.top_k or DEFAULTS.top_k, 0),
            top_p=given(self.top_p, DEFAULTS.top_p),
            repetition_penalty=given(self.repetition_penalty, DEFAULTS.repetition_penalty),
            presence_penalty=given(self.presence_penalty, DEFAULTS.presence_penalty),
            frequency_penalty=given(self.frequency_penalty, DEFAULTS.frequency_penalty),
            stop=tuple(stop),
            seed=self.seed,
            logprobs=top_n,
            logit_bias=logit_bias(self.logit_bias) if self.logit_bias else (),
            min_tokens=self.min_tokens or 0,
            structured_outputs=self.structured(),
        )


ChatCompletionBody = Annotated[ChatCompletionRequest, json_body(ChatCompletionRequest)]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="The token's UTF-8 bytes")


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="The top_logprobs most likely tokens at this step")


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[Any] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"] = Field(
        description="stop: end of text, a stop string or a complete constraint; length: the token limit"
    )


class ChatCompletionResponse(BaseModel):
    id: str = Field(description="chatcmpl-...")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(description="Unix seconds")
    model: str
    system_fingerprint: str | None = Field(default=None, description="The model's version (content hash)")
    choices: list[ChatChoice]
    usage: CompletionUsage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` event of a stream: the first of a choice carries its role, then one per token, then one
    with its finish_reason; with stream_options.include_usage a last one with empty choices and usage."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


def chat_chunk_schema() -> dict[str, Any]:
    return {
        "description": "Server-Sent Events `data: {chunk}` (chat.completion.chunk), then `data: [DONE]`",
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": json_schema_of(ChatCompletionChunk, mode="serialization"),
    }
