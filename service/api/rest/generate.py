"""POST /v1/generate: JSON, or Server-Sent Events with ``stream: true``."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response
from litestar.openapi.datastructures import ResponseSpec

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.http.openapi import also_answers
from service.api.http.request_id import request_id_of
from service.api.rest.envelope import envelope
from service.api.rest.schemas.generate import SSE_EVENT_SCHEMA, GenerateBody, GenerateResponse, GenerationOut
from service.api.rest.sse import generation_events

_OK = ResponseSpec(
    data_container=GenerateResponse,
    description="application/json; with stream: true, text/event-stream instead: one `event: token` per token "
    "(data: {index, token_id, text}), then `event: done` (data: {model, model_version, finish_reason, text, "
    "usage}), or `event: error` (data: the error body) if decoding fails mid-stream",
    generate_examples=False,
)


class GenerateController(Controller):
    path = "/v1/generate"
    tags = ("generation",)

    @json_post(
        "Generate text (continuous batching)",
        responses={**INFERENCE_ERRORS, 200: _OK},
        operation_class=also_answers({"text/event-stream": SSE_EVENT_SCHEMA}),
    )
    async def generate(self, services: Services, request: HttpRequest, data: GenerateBody) -> Response[Any]:
        """Sampling: temperature (0 = greedy), top_k, top_p, repetition_penalty, stop strings, seed.

        Every prompt of a batch uses the same parameters (and the same seed).
        Errors found before decoding starts (validation, full queue, prompt
        too long) are ordinary HTTP errors, also when streaming. (The return
        type is a plain Response so that a stream keeps its text/event-stream
        media type; the 200 body is documented by ``_OK``.)
        """
        core, request_id = services.inference, request_id_of(request) or ""
        params = data.sampling_params()
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            if data.stream:
                streams = await core.open_streams(meta, data.prompts_given, params, data.model, request_id)
                return generation_events(streams, request_id or None)
            outcome = await unless_disconnected(
                request,
                core.generate(
                    meta,
                    data.prompts_given,
                    params,
                    data.model,
                    cache_control(request, data.cache),
                    request_id,
                ),
            )
        results = [GenerationOut.of(g) for g in outcome.results]
        return Response(GenerateResponse(**envelope(outcome), results=results))
