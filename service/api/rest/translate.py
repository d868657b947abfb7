"""POST /v1/translate."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post

from service.api.http.deps import Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import require_json
from service.api.rest.envelope import cache_control, envelope
from service.api.rest.schemas.translate import TranslateBody, TranslateResponse, TranslationOut
from service.pipelines.translate import DecodingParams


class TranslateController(Controller):
    path = "/v1/translate"
    tags = ("translation",)

    @post(
        status_code=200,
        before_request=require_json,
        responses=INFERENCE_ERRORS,
        summary="Translate English to German",
    )
    async def translate(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: TranslateBody,
    ) -> TranslateResponse:
        """Greedy (beam_size 1) or beam search; a batch of texts is answered in order.

        Requests are batched across clients; items with different decoding
        parameters share a batch but decode in separate groups.
        """
        inputs = data.fields_and_texts()
        services.limits.items(data.input_field, len(inputs))
        services.limits.texts(inputs)
        services.limits.new_tokens("max_new_tokens", data.max_new_tokens)
        services.limits.generation_budget("max_new_tokens", len(inputs), data.max_new_tokens, data.beam_size)
        params = DecodingParams(
            beam_size=data.beam_size,
            max_new_tokens=data.max_new_tokens,
            length_penalty=data.length_penalty,
            num_return_sequences=data.num_return_sequences,
        )
        texts = [text for _, text in inputs]
        outcome = await unless_disconnected(
            request,
            services.inference.translate(
                texts,
                params,
                data.model,
                data.input_field,
                cache_control(request, data.cache),
                data.attention_query(services.settings.attention_max_tokens),
            ),
        )
        results = [
            TranslationOut.of(t, data.num_return_sequences, data.return_scores) for t in outcome.results
        ]
        return TranslateResponse(**envelope(outcome), results=results)
