"""POST /v1/extract: extractive QA (``task: "qa"``) and named entities (``task: "entities"``)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post

from service.inference import InferenceService

from ..disconnect import unless_disconnected
from ..envelope import cache_control, envelope
from ..errors import INFERENCE_ERRORS
from ..guards import require_json
from ..limits import RequestLimits
from ..schemas.extract import AnswerOut, EntitiesOut, ExtractBody, ExtractResponse


class ExtractController(Controller):
    path = "/v1/extract"
    tags = ("extraction",)

    @post(
        status_code=200,
        guards=[require_json],
        responses=INFERENCE_ERRORS,
        summary="Answer questions or tag entities",
    )
    async def extract(
        self,
        request: Request[Any, Any, Any],
        data: ExtractBody,
        inference: InferenceService,
        limits: RequestLimits,
    ) -> ExtractResponse:
        """qa: answer span with character offsets into the context; contexts longer than the model's
        window are cut into overlapping windows (the manifest's stride) and the best span over all
        windows wins. entities: ``[{text, label, start, end, score}]`` with offsets into the text.
        """
        if data.task == "entities":
            inputs = data.fields_and_texts()
            limits.items(data.input_field, len(inputs))
            limits.texts(inputs)
            tagged = await unless_disconnected(
                request,
                inference.entities(
                    [t for _, t in inputs], data.model, data.input_field, cache_control(request, data.cache)
                ),
            )
            entities = [EntitiesOut.of(e) for e in tagged.results]
            return ExtractResponse(**envelope(tagged), task="entities", results=entities)
        pairs = data.pairs()
        limits.items(data.input_field, len(pairs))
        limits.texts([(f"{prefix}question", q) for prefix, (q, _) in pairs])
        limits.contexts([(f"{prefix}context", c) for prefix, (_, c) in pairs])
        outcome = await unless_disconnected(
            request,
            inference.answer(
                [pair for _, pair in pairs], data.model, data.input_field, cache_control(request, data.cache)
            ),
        )
        return ExtractResponse(
            **envelope(outcome), task="qa", results=[AnswerOut.of(a) for a in outcome.results]
        )
