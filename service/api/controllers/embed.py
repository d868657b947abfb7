"""POST /v1/embed: sentence embeddings through ``InferenceService.embed`` (batched, cached, limited)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post

from service.inference import InferenceService

from ..disconnect import unless_disconnected
from ..envelope import cache_control, envelope
from ..errors import INFERENCE_ERRORS
from ..guards import require_json
from ..limits import RequestLimits
from ..schemas.embed import EmbedBody, EmbeddingOut, EmbedResponse


class EmbedController(Controller):
    path = "/v1/embed"
    tags = ("embeddings",)

    @post(status_code=200, guards=[require_json], responses=INFERENCE_ERRORS, summary="Embed texts")
    async def embed(
        self,
        request: Request[Any, Any, Any],
        data: EmbedBody,
        inference: InferenceService,
        limits: RequestLimits,
    ) -> EmbedResponse:
        """Sentence embeddings (bert-embedder by default): the mean of the encoder's token states over the
        text, unit length unless ``normalize`` is false. Texts longer than the model's window are cut to it
        (``truncated``)."""
        inputs = data.fields_and_texts()
        limits.items(data.input_field, len(inputs))
        limits.texts(inputs)
        outcome = await unless_disconnected(
            request,
            inference.embed(
                [t for _, t in inputs],
                data.normalize,
                data.model,
                data.input_field,
                cache_control(request, data.cache),
            ),
        )
        return EmbedResponse(**envelope(outcome), results=[EmbeddingOut.of(e) for e in outcome.results])
