"""POST /v1/chat/completions: messages rendered by the model's chat template, then generated as
``/v1/completions`` generates (the same core calls, engine, cache, limits and metrics); OpenAI's
``chat.completion`` answer, or its ``chat.completion.chunk`` stream."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from litestar import Controller, Request, Response
from litestar.openapi.datastructures import ResponseSpec

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.http.openapi import also_answers
from service.api.http.request_id import request_id_of
from service.api.http.streaming import GenerationChunks
from service.api.openai.chat_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionBody,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    TokenLogprobOut,
    TopLogprob,
    chat_chunk_schema,
)
from service.api.openai.completions import FINISH, usage_of
from service.api.openai.errors import OPENAI_ERRORS, OPENAI_EXCEPTION_HANDLERS, openai_stream_error
from service.inference import GenerationStreams, ServedModel, TokenLogprob, TokenOut

_OK = ResponseSpec(
    data_container=ChatCompletionResponse,
    description="application/json; with stream: true, text/event-stream: `data: {chat.completion.chunk}` "
    "events (a choice's first carries its role, then one per token, then one with its finish_reason; with "
    "stream_options.include_usage a last one with empty choices and usage), then `data: [DONE]`",
    generate_examples=False,
)


class ChatLogprobs:
    """Token ids -> OpenAI's chat logprobs (each token decoded alone, its UTF-8 bytes beside it)."""

    def __init__(self, model: ServedModel) -> None:
        self.text = model.token_text

    def top(self, token_id: int, logprob: float) -> TopLogprob:
        token = self.text(token_id)
        return TopLogprob(token=token, logprob=logprob, bytes=list(token.encode()))

    def of(self, entries: Sequence[TokenLogprob]) -> ChoiceLogprobs:
        content = []
        for entry in entries:
            head = self.top(entry.token_id, entry.logprob if entry.logprob is not None else 0.0)
            tops = [self.top(i, lp) for i, lp in entry.top]
            content.append(TokenLogprobOut(**head.model_dump(), top_logprobs=tops))
        return ChoiceLogprobs(content=content)


def _chat_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def _sse(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


async def _chunks(
    data: ChatCompletionRequest,
    request: Request[Any, Any, Any],
    streams: GenerationStreams,
    logprobs: ChatLogprobs,
) -> AsyncIterator[bytes]:
    """OpenAI's chat stream: per choice a first chunk with the role, a chunk per token, a last one with the
    finish_reason; the usage chunk when asked; then ``[DONE]``."""
    chat_id, created = _chat_id(), int(time.time())

    def chunk(choices: list[ChunkChoice], usage: Any = None) -> bytes:
        body = ChatCompletionChunk(
            id=chat_id,
            created=created,
            model=streams.model,
            system_fingerprint=streams.model_version,
            choices=choices,
            usage=usage,
        )
        return _sse(body.model_dump_json())

    try:
        for k in range(streams.count):
            yield chunk([ChunkChoice(index=k, delta=Delta(role="assistant", content=""))])
        async for item in streams:
            k = item.choice
            if isinstance(item, TokenOut):
                event = item.event
                lp = logprobs.of([event.logprob]) if event.logprob is not None else None
                yield chunk([ChunkChoice(index=k, delta=Delta(content=event.text), logprobs=lp)])
            else:
                finish = FINISH[item.generation.finish_reason]
                yield chunk([ChunkChoice(index=k, delta=Delta(), finish_reason=finish)])
        if data.stream_options is not None and data.stream_options.include_usage:
            yield chunk([], usage_of(streams.usage()))
    except Exception as exc:  # headers are sent: the failure can only be reported in-band, as vLLM does
        yield _sse(json.dumps(openai_stream_error(exc, request)))
    yield b"data: [DONE]\n\n"


class ChatController(Controller):
    path = "/v1"
    tags = ("openai",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @json_post(
        "OpenAI-compatible chat completion (the model's chat template, continuous batching)",
        "/chat/completions",
        responses={**OPENAI_ERRORS, 200: _OK},
        operation_class=also_answers({"text/event-stream": chat_chunk_schema()}),
    )
    async def chat_completions(
        self, services: Services, request: HttpRequest, data: ChatCompletionBody
    ) -> Response[Any]:
        """OpenAI's Chat Completions API, as vLLM serves it: the messages become one prompt by the model's
        chat template (``CHAT_TEMPLATE``, or the manifest's ``chat_template``; without one, a 400 naming
        ``model``), then each of the ``n`` choices is one sequence of the running batch. Errors are
        OpenAI's ``{"error": {message, type, param, code}}``; invalid parameters answer 400."""
        core = services.inference
        request_id = request_id_of(request) or ""
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            core.check_ready()
            logprobs = ChatLogprobs(await core.served(meta, data.model, task="text-generation"))
            prompt = await core.chat_prompt(
                meta,
                data.template_messages(),
                data.model,
                data.add_generation_prompt,
                data.chat_template_kwargs,
            )
            if data.stream:
                streams = await core.open_streams(
                    meta, [prompt], data.sampling_params(), data.model, request_id, data.choices
                )
                return GenerationChunks(
                    _chunks(data, request, streams, logprobs),
                    streams,
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            outcome = await unless_disconnected(
                request,
                core.generate(
                    meta,
                    [prompt],
                    data.sampling_params(),
                    data.model,
                    cache_control(request),
                    request_id,
                    data.choices,
                ),
            )
        choices = [
            ChatChoice(
                index=i,
                message=AssistantMessage(content=g.text),
                logprobs=logprobs.of(g.logprobs or []) if data.logprobs else None,
                finish_reason=FINISH[g.finish_reason],
            )
            for i, g in enumerate(outcome.results)
        ]
        body = ChatCompletionResponse(
            id=_chat_id(),
            created=int(time.time()),
            model=outcome.model,
            system_fingerprint=outcome.model_version,
            choices=choices,
            usage=usage_of(outcome.usage),
        )
        return Response(body)
