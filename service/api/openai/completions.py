"""OpenAI-compatible generation: POST /v1/completions (JSON, or OpenAI's SSE chunks); chat is ``chat.py``.

A door into the same house as POST /v1/generate: the same ``InferenceService``
calls (readiness, model resolution, response cache for deterministic requests),
the same engine (every prompt x ``n`` choice is one sequence in the running
batch), the same limits and metrics. Only the JSON differs, and the errors,
which are OpenAI's shape (``openai_errors.py``). GET /v1/models is in ``system.py``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

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
from service.errors import InvalidInputError
from service.inference import Generation, GenerationStreams, ServedModel, TokenLogprob, TokenOut, Usage
from service.metadata import RequestMeta

log = logging.getLogger(__name__)

FINISH: dict[str, Literal["stop", "length"]] = {
    "eos": "stop",
    "stop": "stop",
    "length": "length",
    "deadline": "length",  # cut short by the request's timeout_ms: OpenAI's word for a cut completion
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

    def __init__(self, model: ServedModel) -> None:
        self.text = model.token_text

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
        index=index, text=prefix + g.text, finish_reason=FINISH[g.finish_reason], logprobs=logprobs
    )


def usage_of(usage: Usage) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
    )


def _sse(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


async def _chunks(
    data: CompletionRequest,
    request: Request[Any, Any, Any],
    streams: GenerationStreams,
    texts: TokenTexts,
) -> AsyncIterator[bytes]:
    """OpenAI's stream: a chunk per token and choice, a last one per choice with its finish_reason,
    optionally the usage, then ``[DONE]``. Choice ``k`` is prompt ``k // n``, sample ``k % n``."""
    completion_id, created = _completion_id(), int(time.time())

    def response(choices: list[CompletionChoice], usage: CompletionUsage | None = None) -> bytes:
        body = CompletionResponse(
            id=completion_id,
            created=created,
            model=streams.model,
            system_fingerprint=streams.model_version,
            choices=choices,
            usage=usage,
        )
        return _sse(body.model_dump_json())

    def chunk(choice: CompletionChoice) -> bytes:
        return response([choice])

    offsets = [0] * streams.count  # characters sent per choice, for text_offset
    try:
        if data.echo:
            for k, prompt in enumerate(p for p in data.prompts for _ in range(data.choices)):
                offsets[k] = len(prompt)
                yield chunk(CompletionChoice(index=k, text=prompt, finish_reason=None))
        async for item in streams:
            k = item.choice
            if isinstance(item, TokenOut):
                event = item.event
                logprobs = None
                if event.logprob is not None:
                    logprobs = texts.logprobs([event.logprob], offsets[k])
                offsets[k] += len(event.text)
                yield chunk(CompletionChoice(index=k, text=event.text, finish_reason=None, logprobs=logprobs))
            else:
                finish = FINISH[item.generation.finish_reason]
                yield chunk(CompletionChoice(index=k, text="", finish_reason=finish))
        if data.stream_options is not None and data.stream_options.include_usage:
            yield response([], usage_of(streams.usage()))
    except Exception as exc:  # headers are sent: the failure can only be reported in-band, as vLLM does
        yield _sse(json.dumps(openai_stream_error(exc, request)))
    yield b"data: [DONE]\n\n"


class CompletionsController(Controller):
    path = "/v1"
    tags = ("openai",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @json_post(
        "OpenAI-compatible text completion (continuous batching)",
        "/completions",
        responses={**OPENAI_ERRORS, 200: _OK},
        operation_class=also_answers({"text/event-stream": chunk_schema()}),
    )
    async def completions(
        self, services: Services, request: HttpRequest, data: CompletionBody
    ) -> Response[Any]:
        """OpenAI's legacy Completions API on a text-generation model, as vLLM serves it.

        Every prompt x ``n`` choice is one sequence of the model's running batch; choice ``i`` of a
        seeded request samples with ``seed + i``. Errors are OpenAI's ``{"error": {message, type,
        param, code}}``; invalid parameters answer 400.
        """
        core = services.inference
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            core.check_ready()
            texts = TokenTexts(await core.served(meta, data.model, task="text-generation"))
            if data.stream:
                return await self._stream(request, data, services, texts, meta)
            outcome = await unless_disconnected(
                request,
                core.generate(
                    meta,
                    data.prompts,
                    data.sampling_params(),
                    data.model,
                    cache_control(request),
                    request_id_of(request) or "",
                    data.choices,
                    data.best_of,
                ),
            )
        n = data.choices
        choices = [
            _choice(data, prompt, outcome.results[p * n + i], p * n + i, texts)
            for p, prompt in enumerate(data.prompts)
            for i in range(n)
        ]
        body = CompletionResponse(
            id=_completion_id(),
            created=int(time.time()),
            model=outcome.model,
            system_fingerprint=outcome.model_version,
            choices=choices,
            usage=usage_of(outcome.usage),
        )
        return Response(body)

    async def _stream(
        self,
        request: Request[Any, Any, Any],
        data: CompletionRequest,
        services: Services,
        texts: TokenTexts,
        meta: RequestMeta,
    ) -> Response[Any]:
        if data.echo and data.logprobs is not None:
            raise InvalidInputError(
                "echo with logprobs is answered without streaming (stream: false)", "echo", "unsupported"
            )
        streams = await services.inference.open_streams(
            meta, data.prompts, data.sampling_params(), data.model, request_id_of(request) or "", data.choices
        )
        body = _chunks(data, request, streams, texts)
        return GenerationChunks(
            body, streams, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
