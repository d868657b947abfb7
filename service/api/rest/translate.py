"""POST /v1/translate."""

from __future__ import annotations

from litestar import Controller

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import json_post
from service.api.rest.envelope import envelope
from service.api.rest.schemas.translate import TranslateBody, TranslateResponse, TranslationOut
from service.inference import DecodingParams


class TranslateController(Controller):
    path = "/v1/translate"
    tags = ("translation",)

    @json_post("Translate English to German", responses=INFERENCE_ERRORS)
    async def translate(
        self, services: Services, request: HttpRequest, data: TranslateBody
    ) -> TranslateResponse:
        """Greedy (beam_size 1) or beam search; a batch of texts is answered in order.

        Requests are batched across clients; items with different decoding
        parameters share a batch but decode in separate groups.
        """
        params = DecodingParams(
            beam_size=data.beam_size,
            max_new_tokens=data.max_new_tokens,
            length_penalty=data.length_penalty,
            num_return_sequences=data.num_return_sequences,
        )
        work = services.inference.translate(
            data.inputs, params, data.model, cache_control(request, data.cache), data.attention_query()
        )
        with data.field_names(), data.scheduled():
            outcome = await unless_disconnected(request, work)
        results = [
            TranslationOut.of(t, data.num_return_sequences, data.return_scores) for t in outcome.results
        ]
        return TranslateResponse(**envelope(outcome), results=results)
