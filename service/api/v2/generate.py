"""Triton's generate extension on the v2 routes: ``text_input`` -> ``text_output`` for gpt and the translator.

``POST /v2/models/{name}/generate`` answers once; ``generate_stream`` answers
with Server-Sent Events, ``data: {...}`` only (as Triton sends them). The
parameters are the infer route's (the task's contract, ``oip/tasks.py``), checked by the
inference core.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Controller, Request, post
from litestar.response import ServerSentEvent, ServerSentEventMessage, Stream

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.guards import read_json
from service.api.http.meta import request_meta
from service.api.http.request_id import request_id_of
from service.api.http.streaming import GenerationEvents, sse_event
from service.api.oip.tasks import core_parameters, field_names, flag, scheduling_of
from service.api.v2.errors import V2_ERRORS, V2_EXCEPTION_HANDLERS, v2_stream_error
from service.api.v2.schemas import GenerateRequest, GenerateResponse
from service.errors import InvalidInputError
from service.inference import (
    GenerationStreams,
    InferenceService,
    Outcome,
    ServedModel,
    TokenOut,
    Translation,
    TranslationSequence,
)
from service.inference.params import decoding_params, sampling_params
from service.metadata import RequestMeta

_GENERATE_TASKS = ("text-generation", "translation")


def _route(suffix: str, summary: str, **kwargs: Any) -> Any:
    """POST on ``/models/{name}[/versions/{version}]`` + ``suffix``, its JSON body read by ``read_json``."""
    return post(
        _paths(suffix),
        status_code=200,
        before_request=read_json,
        responses=V2_ERRORS,
        summary=summary,
        **kwargs,
    )


def _paths(suffix: str) -> list[str]:
    return [
        f"/models/{{model_name:str}}{suffix}",
        f"/models/{{model_name:str}}/versions/{{model_version:str}}{suffix}",
    ]


async def _model(core: InferenceService, meta: RequestMeta, name: str, version: str | None) -> ServedModel:
    model = await core.served(meta, name, version=version)
    if model.task not in _GENERATE_TASKS:
        raise InvalidInputError(
            f"model {name!r} serves {model.task}; generate takes a text-generation or translation model",
            "model_name",
            "task_mismatch",
        )
    return model


async def _translation(
    core: InferenceService,
    meta: RequestMeta,
    model: ServedModel,
    text: str,
    parameters: dict[str, Any],
    request: Request[Any, Any, Any],
) -> tuple[Outcome[Translation], TranslationSequence]:
    """The translation of ``text`` and its best hypothesis (the translator streams nothing token by token)."""
    values, names = core_parameters(model.name, model.contract, parameters)
    cache = cache_control(request, flag(parameters, "cache", True))
    with field_names("text_input", names):
        work = core.translate(meta, [text], decoding_params(**values), model.ref, cache)
        outcome = await unless_disconnected(request, work)
    return outcome, outcome.results[0].sequences[0]


def _parameters(data: GenerateRequest) -> dict[str, Any]:
    """``parameters`` and every other top-level field (Triton passes those as parameters too)."""
    return {**(data.model_extra or {}), **(data.parameters or {})}


class GenerateExtensionController(Controller):
    path = "/v2"
    tags = ("open inference protocol v2",)
    exception_handlers = V2_EXCEPTION_HANDLERS

    @_route("/generate", "Triton's generate extension: text_input -> text_output (gpt, translator)")
    async def generate(
        self,
        services: Services,
        request: HttpRequest,
        data: GenerateRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> GenerateResponse:
        """gpt: the completion of ``text_input`` (parameters as for infer: max_tokens, temperature, top_k,
        top_p, repetition_penalty, seed, stop); translator: its translation (beam_size, max_new_tokens,
        length_penalty)."""
        core = services.inference
        meta = request_meta(request)
        model = await _model(core, meta, model_name, model_version)
        parameters = _parameters(data)
        meta = scheduling_of(meta, parameters)
        outcome: Outcome[Any]
        if model.task == "translation":
            outcome, best = await _translation(core, meta, model, data.text_input, parameters, request)
            text, finish = best.text, best.finish_reason
        else:
            values, names = core_parameters(model.name, model.contract, parameters)
            cache = cache_control(request, flag(parameters, "cache", True))
            with field_names("text_input", names):
                params = sampling_params(**values)
                work = core.generate(
                    meta, [data.text_input], params, model.ref, cache, request_id_of(request) or ""
                )
                generated = await unless_disconnected(request, work)
            outcome = generated
            text, finish = generated.results[0].text, generated.results[0].finish_reason
        return GenerateResponse(
            id=data.id,
            model_name=outcome.model,
            model_version=outcome.model_version,
            text_output=text,
            finish_reason=finish,
        )

    @_route(
        "/generate_stream",
        "Triton's generate extension, streamed: one `data: {text_output}` chunk per token",
        media_type="text/event-stream",
    )
    async def generate_stream(
        self,
        services: Services,
        request: HttpRequest,
        data: GenerateRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> Stream:
        """Server-Sent Events, ``data: {...}`` only (as Triton sends them): gpt sends one chunk per token
        (``text_output`` is the text that token adds), then a last chunk with ``text_output: ""`` and
        ``finish_reason``; the translator sends one chunk with the whole translation. An error after the
        first chunk arrives as ``data: {"error": "..."}``; errors before it are ordinary HTTP errors."""
        core = services.inference
        meta = request_meta(request)
        model = await _model(core, meta, model_name, model_version)
        parameters = _parameters(data)
        base: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
        if data.id is not None:
            base = {"id": data.id, **base}
        meta = scheduling_of(meta, parameters)
        if model.task == "translation":
            _, best = await _translation(core, meta, model, data.text_input, parameters, request)
            chunk = {**base, "text_output": best.text, "finish_reason": best.finish_reason}
            return ServerSentEvent(_single(chunk))
        flag(parameters, "cache", True)  # checked, though a stream is never cached
        values, names = core_parameters(model.name, model.contract, parameters)
        with field_names("text_input", names):
            streams = await core.open_streams(
                meta, [data.text_input], sampling_params(**values), model.ref, request_id_of(request) or ""
            )
        return GenerationEvents(_token_chunks(streams, base, request), streams)


async def _single(chunk: dict[str, Any]) -> AsyncIterator[ServerSentEventMessage]:
    yield ServerSentEventMessage(data=msgspec.json.encode(chunk).decode())


async def _token_chunks(
    streams: GenerationStreams, base: dict[str, Any], request: Request[Any, Any, Any]
) -> AsyncIterator[bytes]:
    try:
        async for item in streams:
            if isinstance(item, TokenOut):
                chunk = {**base, "text_output": item.event.text}
            else:
                chunk = {**base, "text_output": "", "finish_reason": item.generation.finish_reason}
            yield sse_event(msgspec.json.encode(chunk))
    except Exception as exc:  # headers are sent: the failure can only be reported in-band
        yield sse_event(msgspec.json.encode(v2_stream_error(exc, request)))
