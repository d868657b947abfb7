"""vLLM's pair-scoring routes: ``POST /v1/rerank`` and ``/v2/rerank`` (Cohere's and Jina's shape, which the
``cohere`` client speaks) and ``POST /v1/score`` (vLLM's), in the OpenAI door's error shape as vLLM answers.

All three are ``InferenceService.score``: one request's (query, document) pairs, scored by a rerank model
or, where none is served, by the embedder's cosine, as vLLM does (``scored_by`` and ``model`` say which).
"""

from __future__ import annotations

import time

from litestar import Controller

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.http.request_id import new_request_id, request_id_of
from service.api.openai.errors import OPENAI_ERRORS, OPENAI_EXCEPTION_HANDLERS
from service.api.openai.score_schemas import (
    RerankBody,
    RerankDocumentOut,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreBody,
    ScoreData,
    ScoreResponse,
    ScoreUsage,
)


class RerankController(Controller):
    path = "/"
    tags = ("rerank",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @json_post("Rerank documents (Cohere, Jina)", ["/v1/rerank", "/v2/rerank"], responses=OPENAI_ERRORS)
    async def rerank(self, services: Services, request: HttpRequest, data: RerankBody) -> RerankResponse:
        """The documents ranked by relevance to the query, best first (``top_n`` of them), each with its
        index in the request and ``relevance_score``: a reranker's, or, where none is served, the
        embedder's cosine (``scored_by``). Cohere's v1 and v2 and Jina's bodies; errors are OpenAI's
        ``{"error": {...}}`` (400 for an invalid field), as vLLM answers these routes."""
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            work = services.inference.score(meta, data.pairs, data.model, cache_control(request))
            outcome = await unless_disconnected(request, work)
        texts = data.texts
        order = sorted(range(len(texts)), key=lambda i: -outcome.results[i].score)
        results = [
            RerankResult(
                index=i,
                relevance_score=outcome.results[i].score,
                document=RerankDocumentOut(text=texts[i]) if data.return_documents else None,
            )
            for i in order[: data.top_n]
        ]
        return RerankResponse(
            id=f"rerank-{request_id_of(request) or new_request_id()}",
            model=outcome.model,
            scored_by=outcome.results[0].scored_by,
            results=results,
            usage=RerankUsage(total_tokens=outcome.usage.input_tokens),
        )


class ScoreController(Controller):
    path = "/v1/score"
    tags = ("rerank",)
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @json_post("Score text pairs (vLLM)", responses=OPENAI_ERRORS)
    async def score(self, services: Services, request: HttpRequest, data: ScoreBody) -> ScoreResponse:
        """vLLM's score API: one score per pair, in order: one query against each document, or two lists
        of equal length paired one by one. Scored by a reranker, or by the embedder's cosine
        (``scored_by``)."""
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            work = services.inference.score(meta, data.pairs, data.model, cache_control(request))
            outcome = await unless_disconnected(request, work)
        return ScoreResponse(
            id=f"score-{request_id_of(request) or new_request_id()}",
            created=int(time.time()),
            model=outcome.model,
            scored_by=outcome.results[0].scored_by,
            data=[ScoreData(index=i, score=s.score) for i, s in enumerate(outcome.results)],
            usage=ScoreUsage(
                prompt_tokens=outcome.usage.input_tokens, total_tokens=outcome.usage.input_tokens
            ),
        )
