"""TEI's routes besides ``/rerank`` and the token routes (``tokens.py``): ``/embed``, ``/predict``,
``/similarity`` and ``/info``, each TEI's body and answer (``router/src/http/types.rs``) over the inference core's task methods.

TEI serves one model; here a body's ``model`` (``?model=`` for ``/info``) picks one, and without it each
route's task default answers (the default embedder; the default text classifier for ``/predict``).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, get

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.guards import json_post
from service.api.http.meta import request_meta
from service.api.tei.errors import TEI_ERRORS, TEI_EXCEPTION_HANDLERS
from service.api.tei.schemas import EmbedBody, PredictBody, SimilarityBody
from service.errors import InvalidInputError
from service.inference import ServedModel

EMBEDDING = "feature-extraction"
CLASSIFICATION = "text-classification"


class TeiController(Controller):
    path = "/"
    tags = ("tei",)
    exception_handlers = TEI_EXCEPTION_HANDLERS

    @json_post("Embed texts (TEI)", "/embed", responses=TEI_ERRORS)
    async def embed(self, services: Services, request: HttpRequest, data: EmbedBody) -> list[list[float]]:
        """One embedding per text, always a list of vectors (``normalize``, ``truncate``,
        ``truncation_direction`` as TEI)."""
        meta = request_meta(request)
        work = services.inference.embed(
            meta,
            data.texts,
            data.normalize,
            data.model,
            cache_control(request),
            data.dimensions,
            data.truncation,
        )
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        return [e.vector for e in outcome.results]

    @json_post("Classify texts (TEI)", "/predict", responses=TEI_ERRORS)
    async def predict(self, services: Services, request: HttpRequest, data: PredictBody) -> Any:
        """Every label's probability, most probable first: ``[{score, label}]`` for one text or pair, a list
        of those for a batch (texts and sentence pairs may mix)."""
        meta = request_meta(request)
        core, cache = services.inference, cache_control(request)
        if data.has_pairs:  # BERT's two segments, [CLS] a [SEP] b [SEP]
            work = core.classify_pairs(meta, data.items, None, data.model, cache, data.truncation)
        else:
            texts = [a for a, _ in data.items]
            work = core.classify_texts(meta, texts, None, data.model, cache, truncation=data.truncation)
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        answers = [[{"score": s.score, "label": s.label} for s in c.top] for c in outcome.results]
        return answers[0] if data.single else answers

    @json_post("Sentence similarity (TEI)", "/similarity", responses=TEI_ERRORS)
    async def similarity(self, services: Services, request: HttpRequest, data: SimilarityBody) -> list[float]:
        """The cosine of the source sentence's embedding with each sentence's, in order."""
        meta = request_meta(request)
        model = data.model or services.inference.model(meta, None, EMBEDDING).name
        work = services.inference.score(meta, data.pairs, model, cache_control(request), data.truncation)
        with data.field_names():
            outcome = await unless_disconnected(request, work)
        return [s.score for s in outcome.results]

    @get("/info", summary="Model info (TEI)", responses=TEI_ERRORS)
    async def info(
        self, services: Services, request: HttpRequest, model: str | None = None
    ) -> dict[str, Any]:
        """TEI's ``/info`` for ``?model=`` (default: the default embedder): its name, version, type (embedding
        with mean pooling, or classifier with its labels) and the request limits."""
        meta = request_meta(request)
        served = await services.inference.served(meta, model, None if model else EMBEDDING)
        return _info(served, services)


def _info(served: ServedModel, services: Services) -> dict[str, Any]:
    manifest, settings = served.manifest, services.settings
    if served.task == EMBEDDING:
        model_type: dict[str, Any] = {"embedding": {"pooling": "mean"}}
    elif served.task == CLASSIFICATION:
        labels = list(manifest.labels or [])
        model_type = {
            "classifier": {
                "id2label": {str(i): label for i, label in enumerate(labels)},
                "label2id": {label: i for i, label in enumerate(labels)},
            }
        }
    else:
        raise InvalidInputError(
            f"model {served.name!r} serves {served.task}; /info describes embedders and classifiers", "model"
        )
    return {
        "model_id": served.name,
        "model_sha": served.version,
        "model_dtype": "float16" if "fp16" in served.loaded.variant.name else "float32",
        "served_model_name": served.name,
        "model_type": model_type,
        "max_concurrent_requests": settings.max_queue_size,
        "max_input_length": manifest.max_sequence_length,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.max_batch_size,
        "max_client_batch_size": settings.max_items,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": "transformer-serving",
        "sha": None,
        "docker_label": None,
    }
