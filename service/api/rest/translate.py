"""POST /v1/translate."""

from __future__ import annotations

from litestar import Controller

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import INFERENCE_ERRORS
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.rest.envelope import envelope
from service.api.rest.schemas.translate import (
    ScoreBody,
    ScoreOut,
    ScoreResponse,
    TranslateBody,
    TranslateResponse,
    TranslationOut,
)
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
            target_prefix=data.prefixes,
            return_alternatives=data.return_alternatives,
            num_hypotheses=data.returned if data.return_alternatives else 1,
            min_decoding_length=data.min_decoding_length,
            no_repeat_ngram_size=data.no_repeat_ngram_size,
            repetition_penalty=data.repetition_penalty,
            suppress_sequences=tuple(data.suppress_sequences or ()),
        )
        meta = data.scheduled(request_meta(request))
        work = services.inference.translate(
            meta,
            data.inputs,
            params,
            data.model,
            cache_control(request, data.cache),
            data.attention_query(),
            data.format,
            data.split_sentences,
        )
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        results = [TranslationOut.of(t, data.returned, data.return_scores) for t in outcome.results]
        return TranslateResponse(**envelope(outcome), results=results)

    @json_post("Score translations (CTranslate2's score_batch)", "/score", responses=INFERENCE_ERRORS)
    async def score(self, services: Services, request: HttpRequest, data: ScoreBody) -> ScoreResponse:
        """Each given translation's log-probability under the model, per token (</s> last) and in total,
        teacher-forced; pairs are batched across clients like translations."""
        meta = data.scheduled(request_meta(request))
        work = services.inference.score_translations(
            meta, data.inputs, data.targets, data.model, cache_control(request, data.cache)
        )
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        return ScoreResponse(**envelope(outcome), results=[ScoreOut.of(s) for s in outcome.results])
