"""TEI's ``POST /rerank``: the texts ranked by relevance to the query, best first, ``[{index, score, text}]``.

``InferenceService.score``, as the other rerank doors: a reranker where one serves, else the embedder's
cosine (the response header ``X-Scored-By`` says which; the body is TEI's bare list).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.tei.errors import TEI_ERRORS, TEI_EXCEPTION_HANDLERS
from service.api.tei.schemas import Rank, RerankBody


class TeiRerankController(Controller):
    path = "/rerank"
    tags = ("tei",)
    exception_handlers = TEI_EXCEPTION_HANDLERS

    @json_post("Rerank texts (TEI)", responses=TEI_ERRORS)
    async def rerank(
        self, services: Services, request: HttpRequest, data: RerankBody
    ) -> Response[list[Rank]]:
        """TEI's rerank: every text's index and score, best first (``text`` with ``return_text``). Scored by
        a reranker (``raw_scores``: its logits), or by the embedder's cosine where none serves."""
        meta = request_meta(request)
        work = services.inference.score(meta, data.pairs, data.model, cache_control(request), data.truncation)
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        scores = outcome.results
        order = sorted(range(len(scores)), key=lambda i: -scores[i].score)
        ranks: list[Any] = [
            Rank(
                index=i,
                text=data.texts[i] if data.return_text else None,
                score=scores[i].raw if data.raw_scores else scores[i].score,
            ).model_dump(exclude_none=True)
            for i in order
        ]
        headers = {"X-Scored-By": scores[0].scored_by, "X-Model": outcome.model}
        return Response(ranks, headers=headers)
