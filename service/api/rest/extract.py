"""POST /v1/extract: extractive QA (``task: "qa"``) and named entities (``task: "entities"``)."""

from __future__ import annotations

from litestar import Controller

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.rest.envelope import envelope
from service.api.rest.schemas.extract import AnswerOut, EntitiesOut, ExtractBody, ExtractResponse


class ExtractController(Controller):
    path = "/v1/extract"
    tags = ("extraction",)

    @json_post("Answer questions or tag entities", responses=INFERENCE_ERRORS)
    async def extract(self, services: Services, request: HttpRequest, data: ExtractBody) -> ExtractResponse:
        """qa: answer span with character offsets into the context; contexts longer than the model's
        window are cut into overlapping windows (the manifest's stride) and the best span over all
        windows wins. entities: ``[{text, label, start, end, score}]`` with offsets into the text.
        """
        core, cache, attention = (
            services.inference,
            cache_control(request, data.cache),
            data.attention_query(),
        )
        with data.field_names():
            meta = data.scheduled(request_meta(request))
            if data.task == "entities":
                tagged = await unless_disconnected(
                    request,
                    core.entities(
                        meta,
                        data.inputs,
                        data.model,
                        cache,
                        attention,
                        data.truncation,
                        data.aggregation_strategy,
                        data.ignore_labels,
                    ),
                )
                entities = [EntitiesOut.of(e) for e in tagged.results]
                return ExtractResponse(**envelope(tagged), task="entities", results=entities)
            outcome = await unless_disconnected(
                request, core.answer(meta, data.pairs(), data.model, cache, attention)
            )
        return ExtractResponse(
            **envelope(outcome), task="qa", results=[AnswerOut.of(a) for a in outcome.results]
        )
