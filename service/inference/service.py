"""What the HTTP layer calls: one method per endpoint, plus the lifecycle of every pipeline.

Each method checks readiness, resolves the model (by name or the task's
default) and runs its pipeline behind the response cache
(``caching.ResponseCache``): the cache key is the model's name and version,
the task and the canonical request (every parameter with its effective
value). Streams are never cached, and neither are requests with ``return_attention`` (``attention``):
they skip the cache both ways, so an answer with maps and one without never stand in for each other.

Phases: starting -> ready -> draining (SIGTERM: new requests get 503, the
ones in flight finish) -> stopping -> stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Literal

from service.cache import blob_digest
from service.cache.response_cache import BYPASS, USE_CACHE, CacheControl, ResponseCache
from service.engine.sampling import SamplingParams
from service.errors import NotReadyError
from service.pipelines.attention import AttentionQuery
from service.pipelines.base import ModelPipeline
from service.pipelines.classify import ImageClassifier, TextClassifier
from service.pipelines.embed import SentenceEmbedder
from service.pipelines.extract import EntityTagger, QuestionAnswerer
from service.pipelines.generate import Generator, OpenStream
from service.pipelines.results import (
    Answer,
    Classification,
    Embedding,
    Entities,
    Generation,
    Outcome,
    Translation,
)
from service.pipelines.translate import DecodingParams, Translator

from .registry import ModelRegistry

log = logging.getLogger(__name__)

Phase = Literal["starting", "ready", "draining", "stopping", "stopped"]

NO_CACHE = ResponseCache(None, ttl_s=1.0, prefix="-")


class InferenceService:
    def __init__(self, registry: ModelRegistry, cache: ResponseCache = NO_CACHE) -> None:
        self.registry = registry
        self.cache = cache
        self.phase: Phase = "starting"
        self._started: list[ModelPipeline] = []

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, warmup: bool) -> None:
        """Start every pipeline's engine, warm each up, and only then report ready.

        A model whose warm-up fails is stopped and refused (one log line), like a
        broken folder: the other models serve.
        """
        for pipeline in list(self.registry.pipelines.values()):
            await pipeline.start()
            self._started.append(pipeline)
            if not warmup:
                continue
            began = time.perf_counter()
            try:
                await pipeline.warmup()
            except Exception as exc:
                log.error("refusing model %s: warm-up failed: %r", pipeline.name, exc)
                await pipeline.stop(timeout_s=1.0)
                self._started.remove(pipeline)
                self.registry.refuse(pipeline.name, f"warm-up failed: {exc!r}")
                continue
            log.info("warmed up %s in %.2fs", pipeline.name, time.perf_counter() - began)
        self.phase = "ready"

    def drain(self) -> None:
        """Refuse new requests (503 with Retry-After) while the ones in flight finish; readiness turns 503."""
        if self.phase in ("starting", "ready"):
            self.phase = "draining"

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, let each engine finish its work within ``timeout_s``; reverse start order."""
        self.phase = "stopping"
        for pipeline in reversed(self._started):
            try:
                await pipeline.stop(timeout_s)
            except Exception:  # one engine failing to stop must not keep the others running
                log.exception("stopping %s failed", pipeline.name)
        self._started.clear()
        self.phase = "stopped"

    def check_ready(self) -> None:
        if self.phase != "ready":
            raise NotReadyError(self.phase)

    # --- one method per endpoint ----------------------------------------------------------

    async def translate(
        self,
        texts: Sequence[str],
        params: DecodingParams,
        model: str | None,
        input_field: str,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Translation]:
        self.check_ready()
        pipeline = self.registry.resolve(Translator, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"texts": list(texts), **asdict(params)},
            result_type=Translation,
            control=cache if attention is None else BYPASS,
            compute=lambda: pipeline.translate(texts, params, attention),
        )

    async def classify_texts(
        self,
        texts: Sequence[str],
        top_k: int,
        model: str | None,
        input_field: str,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Classification]:
        self.check_ready()
        pipeline = self.registry.resolve(TextClassifier, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"texts": list(texts), "top_k": top_k},
            result_type=Classification,
            control=cache if attention is None else BYPASS,
            compute=lambda: pipeline.classify(texts, top_k, attention),
        )

    async def classify_images(
        self,
        images: Sequence[bytes],
        top_k: int,
        model: str | None,
        input_field: str,
        fields: Sequence[str],
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Classification]:
        """``fields`` names each image's own field (``images[2]``), for decode errors."""
        self.check_ready()
        pipeline = self.registry.resolve(ImageClassifier, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"images": [blob_digest(image) for image in images], "top_k": top_k},
            result_type=Classification,
            control=cache if attention is None else BYPASS,
            compute=lambda: pipeline.classify(images, top_k, fields, attention),
        )

    async def answer(
        self,
        pairs: Sequence[tuple[str, str]],
        model: str | None,
        input_field: str,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Answer]:
        self.check_ready()
        pipeline = self.registry.resolve(QuestionAnswerer, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"pairs": [list(pair) for pair in pairs]},
            result_type=Answer,
            control=cache if attention is None else BYPASS,
            compute=lambda: pipeline.answer(pairs, attention),
        )

    async def entities(
        self,
        texts: Sequence[str],
        model: str | None,
        input_field: str,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Entities]:
        self.check_ready()
        pipeline = self.registry.resolve(EntityTagger, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"texts": list(texts)},
            result_type=Entities,
            control=cache if attention is None else BYPASS,
            compute=lambda: pipeline.tag(texts, attention),
        )

    async def embed(
        self,
        texts: Sequence[str],
        normalize: bool,
        model: str | None,
        input_field: str,
        cache: CacheControl = USE_CACHE,
    ) -> Outcome[Embedding]:
        self.check_ready()
        pipeline = self.registry.resolve(SentenceEmbedder, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"texts": list(texts), "normalize": normalize},
            result_type=Embedding,
            control=cache,
            compute=lambda: pipeline.embed(texts, normalize),
        )

    async def generate(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None,
        input_field: str,
        fields: Sequence[str],
        request_id: str = "",
        cache: CacheControl = USE_CACHE,
    ) -> Outcome[Generation]:
        """Cached only when deterministic (``SamplingParams.is_deterministic``: greedy or seeded)."""
        self.check_ready()
        pipeline = self.registry.resolve(Generator, model, input_field)
        return await self.cache.get_or_compute(
            pipeline,
            request={"prompts": list(prompts), **asdict(params)},
            result_type=Generation,
            control=cache if params.is_deterministic else BYPASS,
            compute=lambda: pipeline.generate(prompts, params, fields, request_id),
        )

    async def open_stream(
        self, prompt: str, params: SamplingParams, model: str | None, field: str, request_id: str = ""
    ) -> tuple[Generator, OpenStream]:
        """Streams are never cached: a stream's point is tokens as the model makes them (README, "Cache")."""
        self.check_ready()
        pipeline = self.registry.resolve(Generator, model, field)
        return pipeline, await pipeline.open_stream(prompt, params, field, request_id)
