"""POST /v1/extract: extractive QA (``task: "qa"``) and named entities (``task: "entities"``)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post

from service.api.http.deps import Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import require_json
from service.api.rest.envelope import cache_control, envelope
from service.api.rest.schemas.extract import AnswerOut, EntitiesOut, ExtractBody, ExtractResponse


class ExtractController(Controller):
    path = "/v1/extract"
    tags = ("extraction",)

    @post(
        status_code=200,
        before_request=require_json,
        responses=INFERENCE_ERRORS,
        summary="Answer questions or tag entities",
    )
    async def extract(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: ExtractBody,
    ) -> ExtractResponse:
        """qa: answer span with character offsets into the context; contexts longer than the model's
        window are cut into overlapping windows (the manifest's stride) and the best span over all
        windows wins. entities: ``[{text, label, start, end, score}]`` with offsets into the text.
        """
        if data.task == "entities":
            inputs = data.fields_and_texts()
            services.limits.items(data.input_field, len(inputs))
            services.limits.texts(inputs)
            tagged = await unless_disconnected(
                request,
                services.inference.entities(
                    [t for _, t in inputs],
                    data.model,
                    data.input_field,
                    cache_control(request, data.cache),
                    data.attention_query(services.settings.attention_max_tokens),
                ),
            )
            entities = [EntitiesOut.of(e) for e in tagged.results]
            return ExtractResponse(**envelope(tagged), task="entities", results=entities)
        pairs = data.pairs()
        services.limits.items(data.input_field, len(pairs))
        services.limits.texts([(f"{prefix}question", q) for prefix, (q, _) in pairs])
        services.limits.contexts([(f"{prefix}context", c) for prefix, (_, c) in pairs])
        outcome = await unless_disconnected(
            request,
            services.inference.answer(
                [pair for _, pair in pairs],
                data.model,
                data.input_field,
                cache_control(request, data.cache),
                data.attention_query(services.settings.attention_max_tokens),
            ),
        )
        return ExtractResponse(
            **envelope(outcome), task="qa", results=[AnswerOut.of(a) for a in outcome.results]
        )
