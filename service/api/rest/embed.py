"""POST /v1/embed: sentence embeddings in this API's envelope (OpenAI's /v1/embeddings is in
``api/openai/embeddings.py``: the same ``InferenceService.embed``, batcher and cache entries)."""

from __future__ import annotations

from litestar import Controller

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.rest.envelope import envelope
from service.api.rest.schemas.embed import (
    EmbedBody,
    EmbeddingOut,
    EmbedResponse,
)


class EmbedController(Controller):
    path = "/v1/embed"
    tags = ("embeddings",)

    @json_post("Embed texts", responses=INFERENCE_ERRORS)
    async def embed(self, services: Services, request: HttpRequest, data: EmbedBody) -> EmbedResponse:
        """Sentence embeddings (bert-embedder by default): the mean of the encoder's token states over the
        text, unit length unless ``normalize`` is false. Texts longer than the model's window are cut to it
        (``truncated``; ``truncation_direction`` says which end), or refused with ``truncate: false``."""
        meta = data.scheduled(request_meta(request))
        work = services.inference.embed(
            meta,
            data.inputs,
            data.normalize,
            data.model,
            cache_control(request, data.cache),
            truncation=data.truncation,
        )
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        return EmbedResponse(**envelope(outcome), results=[EmbeddingOut.of(e) for e in outcome.results])
