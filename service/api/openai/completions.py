"""OpenAI-compatible generation: POST /v1/completions (JSON, or OpenAI's SSE chunks), POST /v1/chat/completions.

A door into the same house as POST /v1/generate: the same ``InferenceService``
calls (readiness, model resolution, response cache for deterministic requests),
the same engine (every prompt x ``n`` choice is one sequence in the running
batch), the same limits and metrics. Only the JSON differs, and the errors,
which are OpenAI's shape (``openai_errors.py``). GET /v1/models is in ``system.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from litestar import Controller, Request, Response, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Stream

from service.api.http.deps import Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.guards import require_json
from service.api.http.openapi import also_answers
from service.api.http.request_id import request_id_of
from service.api.openai.errors import OPENAI_ERRORS, OPENAI_EXCEPTION_HANDLERS, openai_stream_error
from service.api.openai.schemas import (
    CompletionBody,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionUsage,
    chunk_schema,
)
from service.api.rest.envelope import cache_control
from service.engine.generation_contract import GenerationResult, TokenEvent, TokenLogprob
from service.engine.generation_stream import GenerationStream
from service.errors import InvalidInputError
from service.inference import InferenceService
from service.pipelines.generate import Generator
from service.pipelines.results import Generation, Outcome

log = logging.getLogger(__name__)

_FINISH: dict[str, Literal["stop", "length"]] = {
    "eos": "stop",
    "stop": "stop",
    "length": "length",
}  # eos: "stop"

_OK = ResponseSpec(
    data_container=CompletionResponse,
    description="application/json; with stream: true, text/event-stream: `data: {chunk}` events "
    "(one per token and choice, then one with each choice's finish_reason; with "
    "stream_options.include_usage a last one with empty choices and usage), then `data: [DONE]`",
    generate_examples=False,
)


class TokenTexts:
    """Token ids -> the strings OpenAI's logprobs show (each token decoded alone, as vLLM does)."""

    def __init__(self, generator: Generator) -> None:
        self.tokenizer = generator.tokenizer

    def text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def logprobs(self, entries: Sequence[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
        """OpenAI's legacy ``{tokens, token_logprobs, top_logprobs, text_offset}`` from ``offset`` on."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for entry in entries:
            token = self.text(entry.token_id)
            out.tokens.append(token)
            out.token_logprobs.append(entry.logprob)
            if entry.logprob is None:  # a prompt's first token: nothing predicts it
                out.top_logprobs.append(None)
            else:  # the sampled token and the N best, as vLLM lists them
                top = {self.text(i): lp for i, lp in entry.top}
                top.setdefault(token, entry.logprob)
                out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(token)
        return out


def _completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def _choice(
    data: CompletionRequest, prompt: str, g: Generation, index: int, texts: TokenTexts
) -> CompletionChoice:
    prefix = prompt if data.echo else ""
    logprobs = None
    if data.logprobs is not None:
        entries = [*(g.prompt_logprobs or []), *(g.logprobs or [])]
        logprobs = texts.logprobs(entries)
    return CompletionChoice(
        index=index, text=prefix + g.text, finish_reason=_FINISH[g.finish_reason], logprobs=logprobs
    )


async def _all_choices(
    inference: InferenceService,
    data: CompletionRequest,
    request: Request[Any, Any, Any],
    fields: list[str],
) -> list[Outcome[Generation]]:
    """One ``generate`` call per choice (each with its own seed), all decoding together; any failure
    cancels the others."""
    request_id = request_id_of(request) or ""
    control = cache_control(request)
    calls = [
        inference.generate(
            data.prompts, data.sampling_params(i), data.model, "prompt", fields, request_id, control
        )
        for i in range(data.choices)
    ]
    if (
        len(calls) == 1
    ):  # the common case: no extra task, so the sequence reaches the engine as early as /v1/generate's
        return [await calls[0]]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _sse(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


async def _merged(
    streams: Sequence[GenerationStream],
) -> AsyncIterator[tuple[int, TokenEvent | GenerationResult]]:
    """Events of several streams as they come, tagged with the stream's index; each ends with its result."""
    queue: asyncio.Queue[tuple[int, TokenEvent | GenerationResult | Exception]] = asyncio.Queue()

    async def pump(index: int, stream: GenerationStream) -> None:
        try:
            async for event in stream:
                queue.put_nowait((index, event))
            queue.put_nowait((index, await stream.result()))
        except Exception as exc:
            queue.put_nowait((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if isinstance(item, GenerationResult):
                remaining -= 1
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def _chunks(
    data: CompletionRequest,
    request: Request[Any, Any, Any],
    streams: list[GenerationStream],
    prompt_tokens: int,
    model: str,
    version: str,
    texts: TokenTexts,
) -> AsyncIterator[bytes]:
    """OpenAI's stream: a chunk per token and choice, a last one per choice with its finish_reason,
    optionally the usage, then ``[DONE]``. Choice ``k`` is prompt ``k // n``, sample ``k % n``."""
    completion_id, created = _completion_id(), int(time.time())

    def response(choices: list[CompletionChoice], usage: CompletionUsage | None = None) -> bytes:
        body = CompletionResponse(
            id=completion_id,
            created=created,
            model=model,
            system_fingerprint=version,
            choices=choices,
            usage=usage,
        )
        return _sse(body.model_dump_json())

    def chunk(choice: CompletionChoice) -> bytes:
        return response([choice])

    finished = False
    offsets = [0] * len(streams)  # characters sent per choice, for text_offset
    completion_tokens = 0
    try:
        if data.echo:
            for k, prompt in enumerate(p for p in data.prompts for _ in range(data.choices)):
                offsets[k] = len(prompt)
                yield chunk(CompletionChoice(index=k, text=prompt, finish_reason=None))
        async for k, item in _merged(streams):
            if isinstance(item, TokenEvent):
                logprobs = None
                if item.logprob is not None:
                    logprobs = texts.logprobs([item.logprob], offsets[k])
                offsets[k] += len(item.text)
                yield chunk(CompletionChoice(index=k, text=item.text, finish_reason=None, logprobs=logprobs))
            else:
                completion_tokens += item.completion_tokens
                finish = _FINISH[item.finish_reason]
                yield chunk(CompletionChoice(index=k, text="", finish_reason=finish))
        finished = True
        if data.stream_options is not None and data.stream_options.include_usage:
            usage = CompletionUsage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            )
            yield response([], usage)
    except Exception as exc:  # headers are sent: the failure can only be reported in-band, as vLLM does
        finished = True
        yield _sse(json.dumps(openai_stream_error(exc, request)))
    finally:
        if not finished:  # the client went away (or the server is stopping): stop decoding
            for stream in streams:
                stream.cancel()
    yield b"data: [DONE]\n\n"


class CompletionsController(Controller):
    path = "/v1"
    tags = ("openai",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @post(
        "/completions",
        status_code=200,
        before_request=require_json,
        responses={**OPENAI_ERRORS, 200: _OK},
        operation_class=also_answers({"text/event-stream": chunk_schema()}),
        summary="OpenAI-compatible text completion (continuous batching)",
    )
    async def completions(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: CompletionBody,
    ) -> Response[Any]:
        """OpenAI's legacy Completions API on a text-generation model, as vLLM serves it.

        Every prompt x ``n`` choice is one sequence of the model's running batch; choice ``i`` of a
        seeded request samples with ``seed + i``. Errors are OpenAI's ``{"error": {message, type,
        param, code}}``; invalid parameters answer 400.
        """
        inputs = data.fields_and_prompts()
        services.limits.items("prompt", len(inputs))
        services.limits.texts(inputs)
        services.limits.new_tokens("max_tokens", data.max_tokens)
        services.limits.generation_budget("max_tokens", len(inputs) * data.choices, data.new_tokens)
        services.inference.check_ready()
        generator = services.inference.registry.resolve(Generator, data.model, "model")
        texts = TokenTexts(generator)
        fields = [f for f, _ in inputs]
        if data.stream:
            return await self._stream(request, data, services.inference, texts, fields)
        outcomes = await unless_disconnected(request, _all_choices(services.inference, data, request, fields))
        n = data.choices
        choices = [
            _choice(data, prompt, outcomes[i].results[p], p * n + i, texts)
            for p, prompt in enumerate(data.prompts)
            for i in range(n)
        ]
        prompt_tokens = sum(g.prompt_tokens for g in outcomes[0].results)
        completion_tokens = sum(g.completion_tokens for o in outcomes for g in o.results)
        body = CompletionResponse(
            id=_completion_id(),
            created=int(time.time()),
            model=outcomes[0].model,
            system_fingerprint=outcomes[0].model_version,
            choices=choices,
            usage=CompletionUsage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        )
        return Response(body)

    async def _stream(
        self,
        request: Request[Any, Any, Any],
        data: CompletionRequest,
        inference: InferenceService,
        texts: TokenTexts,
        fields: list[str],
    ) -> Response[Any]:
        if data.echo and data.logprobs is not None:
            raise InvalidInputError(
                "echo with logprobs is answered without streaming (stream: false)", "echo", "unsupported"
            )
        request_id = request_id_of(request) or ""
        streams: list[GenerationStream] = []
        prompt_tokens = 0
        try:
            for prompt, field in zip(data.prompts, fields, strict=True):
                for i in range(data.choices):
                    generator, opened = await inference.open_stream(
                        prompt, data.sampling_params(i), data.model, field, request_id
                    )
                    streams.append(opened.stream)
                prompt_tokens += opened.prompt_tokens
        except BaseException:  # all choices or none
            for stream in streams:
                stream.cancel()
            raise
        body = _chunks(data, request, streams, prompt_tokens, generator.name, generator.model.version, texts)
        return Stream(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @post(
        "/chat/completions",
        status_code=200,
        before_request=require_json,
        responses=OPENAI_ERRORS,
        summary="OpenAI chat completion: refused, the model has no chat template",
    )
    async def chat_completions(self, data: dict[str, Any], inference: InferenceService) -> Response[Any]:
        """The GPT served here is a base model without a chat template, so there is no honest way to
        turn messages into a prompt: 400 (as vLLM answers for a model without a template). An unknown
        ``model`` is a 404 first. Use POST /v1/completions with a prompt."""
        model = data.get("model")
        inference.check_ready()
        generator = inference.registry.resolve(Generator, model if isinstance(model, str) else None, "model")
        raise InvalidInputError(
            f"model {generator.name!r} is a base model without a chat template, so chat completions are "
            "not supported; use POST /v1/completions with a prompt",
            "model",
            "no_chat_template",
        )
