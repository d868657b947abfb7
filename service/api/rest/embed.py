"""POST /v1/embed (this API's envelope) and POST /v1/embeddings (OpenAI's shape and errors).

Two doors into the same ``InferenceService.embed``: the same batcher, response
cache (an OpenAI request and the same texts on /v1/embed share an entry:
``encoding_format`` only changes how the vectors are written), limits and metrics.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post

from service.api.http.deps import Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import require_json
from service.api.openai.errors import OPENAI_ERRORS, OPENAI_EXCEPTION_HANDLERS
from service.api.rest.envelope import cache_control, envelope
from service.api.rest.schemas.embed import (
    EmbedBody,
    EmbeddingData,
    EmbeddingOut,
    EmbeddingsBody,
    EmbeddingsResponse,
    EmbeddingsUsage,
    EmbedResponse,
)
from service.errors import InvalidInputError
from service.pipelines.embed import SentenceEmbedder


class EmbedController(Controller):
    path = "/v1/embed"
    tags = ("embeddings",)

    @post(status_code=200, before_request=require_json, responses=INFERENCE_ERRORS, summary="Embed texts")
    async def embed(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: EmbedBody,
    ) -> EmbedResponse:
        """Sentence embeddings (bert-embedder by default): the mean of the encoder's token states over the
        text, unit length unless ``normalize`` is false. Texts longer than the model's window are cut to it
        (``truncated``)."""
        inputs = data.fields_and_texts()
        services.limits.items(data.input_field, len(inputs))
        services.limits.texts(inputs)
        outcome = await unless_disconnected(
            request,
            services.inference.embed(
                [t for _, t in inputs],
                data.normalize,
                data.model,
                data.input_field,
                cache_control(request, data.cache),
            ),
        )
        return EmbedResponse(**envelope(outcome), results=[EmbeddingOut.of(e) for e in outcome.results])


class EmbeddingsController(Controller):
    path = "/v1/embeddings"
    tags = ("openai",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @post(
        status_code=200,
        before_request=require_json,
        responses=OPENAI_ERRORS,
        summary="OpenAI-compatible embeddings",
    )
    async def embeddings(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: EmbeddingsBody,
    ) -> EmbeddingsResponse:
        """OpenAI's Embeddings API on a feature-extraction model: unit-length vectors, as floats or base64
        (little-endian float32). ``dimensions`` other than the model's own is refused (400): its
        embeddings were not trained to be shortened. Errors are OpenAI's ``{"error": {message, type,
        param, code}}``; invalid parameters answer 400."""
        inputs = data.fields_and_texts()
        services.limits.items("input", len(inputs))
        services.limits.texts(inputs)
        services.inference.check_ready()
        embedder = services.inference.registry.resolve(SentenceEmbedder, data.model, "model")
        if data.dimensions is not None and data.dimensions != embedder.dimensions:
            raise InvalidInputError(
                f"model {embedder.name!r} makes {embedder.dimensions}-dimensional embeddings and does not "
                "support other sizes (it was not trained for shortened, Matryoshka embeddings)",
                "dimensions",
                "unsupported",
            )
        outcome = await unless_disconnected(
            request,
            services.inference.embed(data.texts, True, embedder.name, "input", cache_control(request)),
        )
        return EmbeddingsResponse(
            data=[EmbeddingData.of(i, e.vector, data.encoding_format) for i, e in enumerate(outcome.results)],
            model=outcome.model,
            usage=EmbeddingsUsage(
                prompt_tokens=outcome.usage.input_tokens, total_tokens=outcome.usage.input_tokens
            ),
        )
