"""The inference core: the one way in for every protocol door (REST, OpenAI, Open Inference v2 over
HTTP and gRPC).

Each task method takes the core's own types (texts, images, ``SamplingParams``,
``DecodingParams``, ``AttentionQuery``), checks readiness, resolves the model (by
name or the task's default), applies the request limits and the defaults
(``limits.py``, here and nowhere else), and runs its pipeline behind the response
cache (``caching.ResponseCache``: the key is the model's name and version, the
task and the canonical request, every parameter with its effective value).
Streams are never cached; requests with ``return_attention`` take the attention
step after inference and skip the cache both ways (``pipelines/attention.py``).

Every request method takes the request's metadata first (``RequestMeta``, ``service/metadata.py``): the
caller's key (the models it may see, the tokens it is charged), its prefix-cache salt and its scheduling,
built by its door and handed on to the pipelines and the engine; nothing here reads a context variable.

Errors name the core's parameter (``inputs``, ``contexts``, ``max_new_tokens``,
``model``...) and the item's index; each door renames them (``api/http/fields.py``).

Phases: starting -> ready -> draining (SIGTERM: new requests get 503, the
ones in flight finish) -> stopping -> stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal, Protocol, TypeVar, cast

from tokenizers import Tokenizer

from service.access.quotas import KeyEntry, Quotas
from service.cache import blob_digest
from service.cache.response_cache import BYPASS, USE_CACHE, CacheControl, ResponseCache
from service.engine.sampling import SamplingParams
from service.errors import (
    InvalidInputError,
    ModelNotFoundError,
    NotReadyError,
    TaskMismatchError,
)
from service.metadata import RequestMeta
from service.models.registry import ModelRegistry
from service.models.served import ServedModel
from service.models.states import ModelState
from service.observe import spans
from service.pipelines import attention as attention_step
from service.pipelines.attention import AttentionQuery
from service.pipelines.base import ModelPipeline
from service.pipelines.classify import ImageClassifier, TextClassifier
from service.pipelines.documents import TextFormat
from service.pipelines.embed import SentenceEmbedder
from service.pipelines.entity_spans import STRATEGIES, Aggregation
from service.pipelines.extract import EntityTagger, QuestionAnswerer
from service.pipelines.generate import Generator, OpenStream
from service.pipelines.rerank import CrossEncoder
from service.pipelines.results import (
    Answer,
    Classification,
    Embedding,
    Entities,
    Generation,
    Outcome,
    Score,
    Translation,
    TranslationScore,
    Usage,
)
from service.pipelines.score import RERANK, CosineScorer, PairScorer
from service.pipelines.text_inputs import CUT_RIGHT, Truncation
from service.pipelines.translate import DecodingParams, Translator

from .limits import CONTEXTS, DOCUMENTS, QUERIES, RequestLimits
from .params import decoding_params, sampling_params
from .streams import GenerationStreams
from .tokens import Token, decoded, tokens_of

log = logging.getLogger(__name__)

Phase = Literal["starting", "ready", "draining", "stopping", "stopped"]
P = TypeVar("P", bound=ModelPipeline)
R = TypeVar("R")

# What a task method hands the cache to run on a miss: its pipeline's call, given the request's metadata.
Compute = Callable[[RequestMeta], Awaitable[Outcome[R]]]

# A generation request that names no length gets this many new tokens (at most MAX_NEW_TOKENS).
DEFAULT_MAX_NEW_TOKENS = 64


class Host(Protocol):
    """What the core needs of the models' host: ``service.models.host.ModelHost``, or the front end's mirror
    of the engine process's (``service.ipc.remote_host.RemoteHost``)."""

    registry: ModelRegistry

    @property
    def up(self) -> bool: ...

    async def start(self, warmup: bool) -> None: ...

    async def stop(self, timeout_s: float) -> None: ...

    async def load(self, name: str) -> ServedModel: ...

    async def unload(self, name: str) -> None: ...

    def repository(self) -> list[ModelState]: ...

    def target(self, model: str | None, task: str | None) -> str | None: ...

    def loads_on_demand(self, name: str) -> bool: ...

    def knows(self, name: str) -> bool: ...

    async def resident(self, model: str | None, task: str | None = None) -> None: ...


class InferenceService:
    """The core over a model host: a ``ModelHost`` in this process, or, in a front end of the split service,
    one that mirrors the engine process's models and asks it to change them (``service/ipc/``)."""

    def __init__(
        self, host: Host, cache: ResponseCache, limits: RequestLimits, quotas: Quotas | None = None
    ) -> None:
        self.host = host
        self.cache = cache
        self.limits = limits
        self.quotas = quotas  # API_KEYS_FILE: the caller's tokens are charged as its requests end
        self.phase: Phase = "starting"
        self._charging: set[asyncio.Future[None]] = set()

    @property
    def registry(self) -> ModelRegistry:
        """Which model answers a request: the host's registry."""
        return self.host.registry

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, warmup: bool) -> None:
        """Start every model (warmed up, unless ``warmup`` is false), and only then report ready."""
        await self.host.start(warmup)
        self.phase = "ready"

    def drain(self) -> None:
        """Refuse new requests (503 with Retry-After) while the ones in flight finish; readiness turns 503."""
        if self.phase in ("starting", "ready"):
            self.phase = "draining"

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, let each model finish its work within ``timeout_s``."""
        self.phase = "stopping"
        await self.host.stop(timeout_s)
        self.phase = "stopped"

    # --- the repository while serving -----------------------------------------------------

    async def load(self, name: str) -> ServedModel:
        """Load model ``name`` from its folder, or reload it (``ModelHost.load``)."""
        return await self.host.load(name)

    async def unload(self, name: str) -> None:
        await self.host.unload(name)

    def repository(self, meta: RequestMeta) -> list[ModelState]:
        """Every model folder and served model the caller may know of (its key's models, when it lists some)."""
        return [state for state in self.host.repository() if meta.may_see(state.name)]

    async def resident(self, meta: RequestMeta, model: str | None, task: str | None = None) -> None:
        """With a memory budget, the model a request names (or its task's default) loaded if it is not
        resident, once the caller's key is known to be allowed it: a key may not load (and so unload
        others for) a model it may not use (``ModelHost.resident``)."""
        name = self.host.target(model, task)
        if name is None:
            return
        if name not in self.registry.versions and self.host.loads_on_demand(name):
            self._allowed(meta, name)
        await self.host.resident(model, task)

    def check_ready(self) -> None:
        if self.phase != "ready":
            raise NotReadyError(self.phase)
        if not self.host.up:
            raise NotReadyError("waiting for its engine process, which is restarting")

    @property
    def ready(self) -> bool:
        """Ready for inference, with at least one model to serve (and, in a front end of the split service,
        its engine process up)."""
        return self.phase == "ready" and self.host.up and bool(self.registry.pipelines)

    # --- what the doors may know of the models --------------------------------------------

    def models(self, meta: RequestMeta, every_key: bool = False) -> list[ServedModel]:
        """Each served model the caller may know of (``every_key``: all, whoever asks), as its newest
        version (``versions``: all that serve)."""
        return [
            self._view(versions[0])
            for name, versions in self.registry.versions.items()
            if every_key or meta.may_see(name)
        ]

    def _view(self, pipeline: ModelPipeline) -> ServedModel:
        return ServedModel.of(
            pipeline, self.registry.default_for(pipeline.name), self.registry.versions.get(pipeline.name, [])
        )

    def refused(self, meta: RequestMeta) -> dict[str, str]:
        """Folders refused at start-up (or at warm-up), with the reason as callers may see it (no host paths)."""
        return dict(sorted((n, r) for n, r in self.registry.refused.items() if meta.may_see(n)))

    def check_servable(self, meta: RequestMeta, name: str, version: str | None = None) -> None:
        """``ModelNotFoundError`` (404) unless model ``name`` (``version``) serves, or would load on its first
        request (a memory budget): what a door checks before it reads a body."""
        if name in self.registry.versions or not self.host.loads_on_demand(name) or not meta.may_see(name):
            self.model(meta, name, version=version)

    def model_ready(
        self, meta: RequestMeta, name: str, version: str | None = None
    ) -> tuple[ServedModel | None, bool]:
        """Triton's model readiness: the resident model (None when not resident) and whether it answers now.
        A model the service knows (resident, refused, or a folder of the repository, loadable on demand or
        not) that is not resident, or not in that version, is not ready; a name it does not know is
        ``ModelNotFoundError`` (404, ``NOT_FOUND``), as is a model the caller's key may not use."""
        if not meta.may_see(name.split("@", 1)[0]):
            raise ModelNotFoundError(name, meta.visible(self.registry.versions))
        if name in self.registry.versions:
            try:
                model = self.model(meta, name, version=version)
            except ModelNotFoundError:  # the model serves, that version does not
                return None, False
            return model, self.phase == "ready"
        if not self.host.knows(name):
            raise ModelNotFoundError(name, meta.visible(self.registry.versions))
        return None, False

    async def served(
        self, meta: RequestMeta, name: str | None, task: str | None = None, version: str | None = None
    ) -> ServedModel:
        """``model``, once the model is resident: with a memory budget, a model of the repository a request
        names is loaded on demand (``resident``) before the door reads it. What a door calls for a request."""
        await self.resident(meta, name, task)
        return self.model(meta, name, task, version)

    def model(
        self, meta: RequestMeta, name: str | None, task: str | None = None, version: str | None = None
    ) -> ServedModel:
        """The loaded model ``name`` (default: ``task``'s default model), its newest version; with
        ``version`` (a version folder's number, or the content hash answers carry), that version, if it
        serves; with ``task``, only if it serves that task."""
        if task is not None:
            pipeline = self.registry.resolve_task(task, name, meta)
        else:
            assert name is not None, "a model by name, or a task's default"
            pipeline = self.registry.get(name, meta=meta)
        if version is not None:
            pipeline = self.registry.get(pipeline.name, version, meta)
        self._allowed(meta, pipeline.name)
        return self._view(pipeline)

    # --- one method per task --------------------------------------------------------------

    async def _answer(
        self,
        meta: RequestMeta,
        pipeline: ModelPipeline | PairScorer,
        request: dict[str, Any],
        result_type: type[R],
        cache: CacheControl,
        compute: Compute[R],
    ) -> Outcome[R]:
        """The answer, from the cache or computed, charged to the caller's key unless cached: the core's
        span of the request (named for its task), whose children are the cache lookup, the tokenizing and
        the queue wait (``compute`` is given ``meta`` traced under this span)."""
        with spans.span(pipeline.task, pipeline.model.request_span_attributes):
            traced = meta.traced(spans.current_context())
            outcome = await self.cache.get_or_compute(
                pipeline,
                request=request,
                result_type=result_type,
                control=cache,
                compute=lambda: compute(traced),
            )
        if not outcome.cached:
            await self._charge(meta, outcome.usage)
        return outcome

    async def _charge(self, meta: RequestMeta, usage: Usage) -> None:
        """The tokens the caller's key read and generated, against its tokens per minute."""
        if meta.key is not None and self.quotas is not None:
            await self.quotas.charge(cast(KeyEntry, meta.key), usage.input_tokens + usage.output_tokens)

    def _charge_abandoned(self, meta: RequestMeta, usage: Usage) -> None:
        """What a request that failed or whose caller left had used, charged in the background (its task is
        being cancelled): generated tokens are spent whether or not anyone read them."""
        if meta.key is None or self.quotas is None:
            return
        charging = asyncio.ensure_future(self._charge(meta, usage))
        self._charging.add(charging)
        charging.add_done_callback(self._charging.discard)

    def _allowed(self, meta: RequestMeta, name: str) -> None:
        """A model the caller's key may not use is, to that key, a model that does not exist: the same 404,
        naming only the models it may use, so that no answer tells a key which other models serve."""
        if not meta.may_see(name):
            raise ModelNotFoundError(name, meta.visible(self.registry.versions))

    async def _resolve(self, meta: RequestMeta, kind: type[P], model: str | None) -> P:
        """After the request's own checks: readiness, then the model (``model``, or the task's default),
        loaded first if it is in the repository but not resident (``resident``).

        The caller holds ``pipeline.leased()`` while it uses it: a version replaced or unloaded meanwhile
        (``load``, ``unload``) stops, and frees its sessions, only once every request on it is done."""
        self.check_ready()
        await self.resident(meta, model, kind.task)  # a key's model list is checked before any load
        pipeline = self.registry.resolve(kind, model, meta)
        self._allowed(meta, pipeline.name)
        return pipeline

    def _texts(self, texts: Sequence[str], attention: AttentionQuery | None = None) -> None:
        self.limits.items(len(texts))
        self.limits.texts(texts)
        self._one_input(len(texts), attention)

    @staticmethod
    def _one_input(count: int, attention: AttentionQuery | None) -> None:
        if attention is not None and count != 1:
            raise InvalidInputError(
                "return_attention takes one input, not a batch", "return_attention", "one_input"
            )

    async def translate(
        self,
        meta: RequestMeta,
        texts: Sequence[str],
        params: DecodingParams,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
        text_format: TextFormat = "text",
        split_sentences: bool = True,
    ) -> Outcome[Translation]:
        """Each text is a document (``pipelines/documents.py``): split into sentences (unless
        ``split_sentences`` is false), plain text or HTML. Its sentences are the request's items: MAX_ITEMS
        and the generation budget count them, and each takes a place in the queue. With
        ``return_attention`` the one text is translated whole, as one sentence."""
        self._texts(texts, attention)
        if len(params.target_prefix) not in (0, 1, len(texts)):
            raise InvalidInputError(
                f"{len(params.target_prefix)} prefixes for {len(texts)} texts: give one, or one per text",
                "target_prefix",
                "out_of_range",
            )
        beams = max(params.beam_size, params.num_hypotheses if params.return_alternatives else 1)
        if attention is not None and text_format != "text":
            raise InvalidInputError("return_attention takes plain text", "format", "unsupported")
        self.limits.new_tokens(params.max_new_tokens)
        pipeline = await self._resolve(meta, Translator, model)
        with pipeline.leased():
            documents = None
            if attention is not None:
                self.limits.generation_budget(len(texts), params.max_new_tokens, beams)
                params = pipeline.attention_params(texts[0], params, self.limits.attention_max_tokens)
            else:
                documents = pipeline.documents(texts, text_format, split_sentences)
                sentences = sum(len(d.sentences) for d in documents)
                self.limits.sentences(sentences)
                self.limits.generation_budget(sentences, params.max_new_tokens, beams)
            key = {"texts": list(texts), **asdict(params)}
            if documents is not None:
                key |= {"format": text_format, "split_sentences": split_sentences}
            return await self._with_attention(
                meta,
                pipeline,
                attention,
                texts,
                key,
                Translation,
                cache,
                lambda m: pipeline.translate(texts, params, documents, m),
            )

    async def score_translations(
        self,
        meta: RequestMeta,
        texts: Sequence[str],
        translations: Sequence[str],
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
    ) -> Outcome[TranslationScore]:
        """Each translation's log-probability given its text (CTranslate2's ``score_batch``): each text and
        each translation within the text limits, one pair an item."""
        self._texts(texts)
        if len(translations) != len(texts):
            raise InvalidInputError(
                f"{len(translations)} translations for {len(texts)} texts: one per text",
                "translations",
                "out_of_range",
            )
        self.limits.texts(translations, "translations")
        pipeline = await self._resolve(meta, Translator, model)
        with pipeline.leased():
            return await self._answer(
                meta,
                pipeline,
                {"score": True, "texts": list(texts), "translations": list(translations)},
                TranslationScore,
                cache,
                lambda m: pipeline.score(texts, translations, m),
            )

    async def classify_texts(
        self,
        meta: RequestMeta,
        texts: Sequence[str],
        top_k: int | None = None,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
        truncation: Truncation = CUT_RIGHT,
    ) -> Outcome[Classification]:
        """``top_k`` None: every label, most probable first."""
        self._texts(texts, attention)
        pipeline = await self._resolve(meta, TextClassifier, model)
        with pipeline.leased():
            k = len(pipeline.labels) if top_k is None else top_k
            return await self._with_attention(
                meta,
                pipeline,
                attention,
                texts,
                {"texts": list(texts), "top_k": k, **truncation.key},
                Classification,
                cache,
                lambda m: pipeline.classify(texts, k, truncation, m),
            )

    async def classify_pairs(
        self,
        meta: RequestMeta,
        pairs: Sequence[tuple[str, str | None]],
        top_k: int | None = None,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        truncation: Truncation = CUT_RIGHT,
    ) -> Outcome[Classification]:
        """Sentence pairs (a ``None`` second: a single text) through a text classifier, the pair encoded as
        BERT reads two segments; errors name ``inputs`` with the item's index."""
        self.limits.items(len(pairs))
        self.limits.texts([a for a, _ in pairs])
        for index, (_, b) in enumerate(pairs):
            if b is not None:
                try:
                    self.limits.texts([b])
                except InvalidInputError as exc:
                    exc.index = index
                    raise
        pipeline = await self._resolve(meta, TextClassifier, model)
        with pipeline.leased():
            k = len(pipeline.labels) if top_k is None else top_k
            return await self._answer(
                meta,
                pipeline,
                {"pairs": [list(pair) for pair in pairs], "top_k": k, **truncation.key},
                Classification,
                cache,
                lambda m: pipeline.classify_pairs(pairs, k, truncation, m),
            )

    async def classify_images(
        self,
        meta: RequestMeta,
        images: Sequence[bytes],
        top_k: int | None = None,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Classification]:
        """``images``: PNG/JPEG bytes; an undecodable one is an error naming its index."""
        self.limits.items(len(images))
        self.limits.images(images)
        self._one_input(len(images), attention)
        pipeline = await self._resolve(meta, ImageClassifier, model)
        with pipeline.leased():
            k = len(pipeline.labels) if top_k is None else top_k
            return await self._with_attention(
                meta,
                pipeline,
                attention,
                images,
                {"images": [blob_digest(image) for image in images], "top_k": k},
                Classification,
                cache,
                lambda m: pipeline.classify(images, k, m),
            )

    async def answer(
        self,
        meta: RequestMeta,
        pairs: Sequence[tuple[str, str]],
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Answer]:
        """``pairs``: (question, context); errors name ``inputs`` (the questions) or ``contexts``."""
        self._texts([q for q, _ in pairs], attention)
        self.limits.texts([c for _, c in pairs], CONTEXTS)
        pipeline = await self._resolve(meta, QuestionAnswerer, model)
        with pipeline.leased():
            return await self._with_attention(
                meta,
                pipeline,
                attention,
                pairs,
                {"pairs": [list(pair) for pair in pairs]},
                Answer,
                cache,
                lambda m: pipeline.answer(pairs, m),
            )

    async def entities(
        self,
        meta: RequestMeta,
        texts: Sequence[str],
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
        truncation: Truncation = CUT_RIGHT,
        aggregation_strategy: str | None = None,
        ignore_labels: Sequence[str] | None = None,
    ) -> Outcome[Entities]:
        """``aggregation_strategy`` (none, simple, first, average, max) and ``ignore_labels`` (default
        ["O"]) as transformers' pipeline defines them; with neither, the model's own grouping, unchanged."""
        self._texts(texts, attention)
        if aggregation_strategy is not None and aggregation_strategy not in STRATEGIES:
            raise InvalidInputError(
                f"unknown aggregation {aggregation_strategy!r}; one of {', '.join(STRATEGIES)}",
                "aggregation_strategy",
                "unknown_aggregation",
            )
        if ignore_labels is not None and (
            not isinstance(ignore_labels, list | tuple) or not all(isinstance(x, str) for x in ignore_labels)
        ):
            raise InvalidInputError("must be a list of labels (strings)", "ignore_labels", "type_error")
        pipeline = await self._resolve(meta, EntityTagger, model)
        with pipeline.leased():
            aggregation = None
            if aggregation_strategy is not None or ignore_labels is not None:
                labels = ("O",) if ignore_labels is None else tuple(ignore_labels)
                aggregation = Aggregation(aggregation_strategy or pipeline.default_aggregation, labels)
            return await self._with_attention(
                meta,
                pipeline,
                attention,
                texts,
                {"texts": list(texts), **truncation.key, **(aggregation.key if aggregation else {})},
                Entities,
                cache,
                lambda m: pipeline.tag(texts, truncation, aggregation, m),
            )

    async def _with_attention(
        self,
        meta: RequestMeta,
        pipeline: Any,
        attention: AttentionQuery | None,
        inputs: Sequence[Any],
        request: dict[str, Any],
        result_type: type[R],
        cache: CacheControl,
        compute: Compute[R],
    ) -> Outcome[R]:
        """The answer, through the cache; with ``attention``, the attention step after it, uncached."""
        if attention is None:
            return await self._answer(meta, pipeline, request, result_type, cache, compute)
        return await attention_step.with_attention(
            pipeline,
            attention,
            inputs[0],
            self.limits.attention_max_tokens,
            # the rule: a request with return_attention never reads nor writes the response cache
            lambda: self._answer(meta, pipeline, request, result_type, BYPASS, compute),
        )

    async def embed(
        self,
        meta: RequestMeta,
        texts: Sequence[str],
        normalize: bool = True,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        dimensions: int | None = None,
        truncation: Truncation = CUT_RIGHT,
    ) -> Outcome[Embedding]:
        """``dimensions``, when given, must be the model's own (its embeddings were not trained to be cut)."""
        self._texts(texts)
        pipeline = await self._resolve(meta, SentenceEmbedder, model)
        with pipeline.leased():
            if dimensions is not None and dimensions != pipeline.dimensions:
                raise InvalidInputError(
                    f"model {pipeline.name!r} makes {pipeline.dimensions}-dimensional embeddings and does not "
                    "support other sizes (it was not trained for shortened, Matryoshka embeddings)",
                    "dimensions",
                    "unsupported",
                )
            return await self._answer(
                meta,
                pipeline,
                {"texts": list(texts), "normalize": normalize, **truncation.key},
                Embedding,
                cache,
                lambda m: pipeline.embed(texts, normalize, truncation, m),
            )

    async def score(
        self,
        meta: RequestMeta,
        pairs: Sequence[tuple[str, str]],
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        truncation: Truncation = CUT_RIGHT,
    ) -> Outcome[Score]:
        """One score per (query, document) pair, in order (rerank, score): by a model that scores pairs
        when one is named or serves the task, else by the embedder's cosine (``pipelines/score.py``).
        At most MAX_ITEMS pairs; errors name ``queries`` or ``documents`` with the pair's index."""
        self.limits.documents(len(pairs))
        self.limits.texts([q for q, _ in pairs], QUERIES)
        self.limits.texts([d for _, d in pairs], DOCUMENTS)
        scorer = await self._scorer(meta, model)
        with scorer.leased():
            return await self._answer(
                meta,
                scorer,
                {"pairs": [list(pair) for pair in pairs], "scored_by": scorer.scored_by, **truncation.key},
                Score,
                cache,
                lambda m: scorer.score(pairs, truncation, m),
            )

    async def _scorer(self, meta: RequestMeta, model: str | None) -> PairScorer:
        """The named model, or the rerank task's default, as a scorer of pairs; with neither, the default
        embedder, scoring by cosine. A model of another task is refused (naming ``model``)."""
        self.check_ready()
        by_cosine = model is None and RERANK not in self.registry.defaults
        await self.resident(meta, model, SentenceEmbedder.task if by_cosine else RERANK)
        if by_cosine:
            pipeline: ModelPipeline = self.registry.resolve(SentenceEmbedder, None, meta)
        elif model is None:
            pipeline = self.registry.resolve_task(RERANK, None, meta)
        else:
            pipeline = self.registry.get(model, meta=meta)
        self._allowed(meta, pipeline.name)
        if isinstance(pipeline, PairScorer):
            return pipeline
        if isinstance(pipeline, SentenceEmbedder):
            return CosineScorer(pipeline)
        raise TaskMismatchError(pipeline.name, pipeline.task, f"{RERANK} (or {SentenceEmbedder.task})")

    # --- tokens ---------------------------------------------------------------------------

    async def _tokenizer_of(
        self, meta: RequestMeta, model: str | None, task: str | None
    ) -> tuple[ServedModel, Tokenizer]:
        """The model's own tokenizer (``model``, or ``task``'s default); a model without one (the image
        classifier) is refused, naming ``model``."""
        self.check_ready()
        served = await self.served(meta, model, task)
        if served.loaded.tokenizer is None:
            raise InvalidInputError(
                f"model {served.name!r} reads images and has no tokenizer", "model", "no_tokenizer"
            )
        return served, served.loaded.tokenizer

    async def tokenize(
        self,
        meta: RequestMeta,
        texts: Sequence[str],
        model: str | None = None,
        task: str | None = None,
        add_special_tokens: bool = True,
    ) -> tuple[ServedModel, list[list[Token]]]:
        """Each text's tokens by the model's tokenizer (every token: no truncation), at most MAX_ITEMS texts
        within MAX_TEXT_CHARS; not cached, not charged (no model runs)."""
        self._texts(texts)
        served, tokenizer = await self._tokenizer_of(meta, model, task)
        return served, tokens_of(tokenizer, texts, add_special_tokens)

    async def detokenize(
        self,
        meta: RequestMeta,
        rows: Sequence[Sequence[int]],
        model: str | None = None,
        task: str | None = None,
        skip_special_tokens: bool = True,
    ) -> tuple[ServedModel, list[str]]:
        """Each row of token ids as text by the model's tokenizer (at most MAX_ITEMS rows)."""
        self.limits.items(len(rows))
        served, tokenizer = await self._tokenizer_of(meta, model, task)
        return served, decoded(tokenizer, rows, skip_special_tokens)

    # --- any task, in its contract's terms ------------------------------------------------

    async def infer(
        self,
        meta: RequestMeta,
        model: str,
        inputs: Mapping[str, Sequence[Any]],
        parameters: Mapping[str, Any],
        cache: CacheControl = USE_CACHE,
        request_id: str = "",
    ) -> Outcome[Any]:
        """One request in its task contract's terms (``ServedModel.contract``): ``inputs`` by the contract's
        input names (texts, or image bytes), ``parameters`` by the core's names. The tensor doors (v2 over
        HTTP and gRPC) come in here; errors name ``inputs`` (``contexts`` for a second input) and the core's
        parameters, as the task methods' do."""
        await self.resident(meta, model)
        task = self.model(meta, model).task
        return await _BY_TASK[task](self, meta, model, inputs, dict(parameters), cache, request_id)

    # --- generation -----------------------------------------------------------------------

    async def _generation(
        self,
        meta: RequestMeta,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None,
        choices: int,
        choices_field: str = "n",
    ) -> tuple[Generator, SamplingParams]:
        """Readiness, limits and the default length, then the model (``choices_field``: the parameter that
        asked for ``choices`` sequences per prompt, named when they cannot fit the queue)."""
        self._texts(prompts)
        self.limits.sequences(len(prompts), choices, choices_field)
        self.limits.new_tokens(params.max_new_tokens)
        if params.max_new_tokens is None:
            default = min(DEFAULT_MAX_NEW_TOKENS, self.limits.max_new_tokens)
            params = dataclasses.replace(params, max_new_tokens=default)
        self.limits.generation_budget(len(prompts) * choices, params.max_new_tokens)
        return await self._resolve(meta, Generator, model), params

    async def generate(
        self,
        meta: RequestMeta,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        request_id: str = "",
        choices: int = 1,
        best_of: int | None = None,
    ) -> Outcome[Generation]:
        """``choices`` per prompt, all decoding together in the running batch; results prompt-major (prompt
        ``p``, choice ``c`` at ``p * choices + c``); choice ``c`` of a seeded request samples with
        ``seed + c``. Each choice is cached only when deterministic (greedy or seeded).

        ``best_of`` > ``choices`` (OpenAI's legacy parameter, as vLLM served it): ``best_of`` sequences
        per prompt, of which the ``choices`` with the highest cumulative log-probability (the model's raw
        one, the sum of the tokens' reported logprobs) are returned, best first; usage counts every
        sequence generated, as OpenAI bills them."""
        run = max(best_of or choices, choices)
        ranked = run > choices
        asked = params
        if ranked and params.logprobs is None:
            params = dataclasses.replace(params, logprobs=0)  # each token's own logprob, for the ranking
        pipeline, params = await self._generation(
            meta, prompts, params, model, run, "best_of" if ranked else "n"
        )
        with pipeline.leased():

            def abandoned(usage: Usage) -> None:
                self._charge_abandoned(meta, usage)

            def one(choice: SamplingParams) -> Awaitable[Outcome[Generation]]:
                return self._answer(
                    meta,
                    pipeline,
                    {"prompts": list(prompts), **asdict(choice)},
                    Generation,
                    cache if choice.is_deterministic else BYPASS,
                    lambda m: pipeline.generate(prompts, choice, request_id, abandoned, m),
                )

            if run == 1:  # no extra task: the sequences reach the engine as early as possible
                return await one(params)
            tasks = [asyncio.ensure_future(one(params.for_choice(c))) for c in range(run)]
            try:
                outcomes = await asyncio.gather(*tasks)
            except BaseException:  # any failure cancels the other choices
                for task in tasks:
                    task.cancel()
                raise
            results = [o.results[p] for p in range(len(prompts)) for o in outcomes]
            usage = Usage.of_generations(results, run)
            if ranked:
                results = _best(results, run, choices, keep_logprobs=asked.logprobs is not None)
            return Outcome(
                pipeline.name,
                pipeline.model.version,
                results,
                usage,
                cached=all(o.cached for o in outcomes),
            )

    async def chat_prompt(
        self,
        meta: RequestMeta,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """A chat's messages as one prompt, by the model's chat template (then ``generate`` or
        ``open_streams`` it); InvalidInputError naming ``model`` when it has none, ``messages`` or a
        ``chat_template_kwargs`` key when the template cannot take them."""
        pipeline = await self._resolve(meta, Generator, model)
        return await pipeline.chat_prompt(messages, add_generation_prompt, template_kwargs or {})

    async def open_streams(
        self,
        meta: RequestMeta,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None = None,
        request_id: str = "",
        choices: int = 1,
    ) -> GenerationStreams:
        """Live token streams, ``choices`` per prompt (prompt-major), all admitted or none. Never cached: a
        stream's point is tokens as the model makes them. The caller cancels them if it stops reading."""
        pipeline, params = await self._generation(meta, prompts, params, model, choices)
        traced = meta.traced(spans.current_context())  # the streams' engine spans: children of the caller's
        with pipeline.leased():
            opened: list[OpenStream] = []
            try:
                for index, prompt in enumerate(prompts):
                    for c in range(choices):
                        try:
                            opened.append(
                                await pipeline.open_stream(prompt, params.for_choice(c), request_id, traced)
                            )
                        except InvalidInputError as exc:
                            exc.index = index
                            raise
            except BaseException:
                for stream in opened:
                    stream.cancel()
                raise
            return GenerationStreams(
                pipeline.name, pipeline.model.version, opened, choices, functools.partial(self._charge, meta)
            )


def _best(results: list[Generation], run: int, keep: int, keep_logprobs: bool) -> list[Generation]:
    """Per prompt (``run`` results each, prompt-major), the ``keep`` of highest cumulative logprob, best
    first (ties: the earlier choice); their logprobs dropped unless the client asked for them."""
    kept: list[Generation] = []
    for start in range(0, len(results), run):
        group = results[start : start + run]
        order = sorted(range(run), key=lambda c: -sum(t.logprob or 0.0 for t in group[c].logprobs or ()))
        for c in order[:keep]:
            g = group[c]
            kept.append(g if keep_logprobs else dataclasses.replace(g, logprobs=None))
    return kept


def _truncation(p: Mapping[str, Any]) -> Truncation:
    """A tensor door's ``truncate`` and ``truncation_direction`` as the pipelines' ``Truncation``."""
    side = p.get("truncation_direction", "right")
    if not isinstance(side, str) or side.lower() not in ("left", "right"):
        raise InvalidInputError("must be left or right", "truncation_direction", "out_of_range")
    cut = p.get("truncate")
    if cut is None and side.lower() == "right":
        return CUT_RIGHT
    return Truncation(cut is not False, "left" if side.lower() == "left" else "right")


_TaskCall = Callable[
    [InferenceService, RequestMeta, str, Mapping[str, Sequence[Any]], dict[str, Any], CacheControl, str],
    Awaitable[Outcome[Any]],
]

# task -> its method, from the contract's inputs (by name) and the core's parameters (``infer``)
_BY_TASK: dict[str, _TaskCall] = {
    TextClassifier.task: lambda core, meta, m, i, p, cache, rid: core.classify_texts(
        meta, i["text"], None, m, cache, truncation=_truncation(p)
    ),
    ImageClassifier.task: lambda core, meta, m, i, p, cache, rid: core.classify_images(
        meta, i["image"], None, m, cache
    ),
    QuestionAnswerer.task: lambda core, meta, m, i, p, cache, rid: core.answer(
        meta, list(zip(i["question"], i["context"], strict=True)), m, cache
    ),
    EntityTagger.task: lambda core, meta, m, i, p, cache, rid: core.entities(
        meta,
        i["text"],
        m,
        cache,
        truncation=_truncation(p),
        aggregation_strategy=p.get("aggregation_strategy"),
        ignore_labels=p.get("ignore_labels"),
    ),
    SentenceEmbedder.task: lambda core, meta, m, i, p, cache, rid: core.embed(
        meta, i["text"], p.get("normalize", True), m, cache, truncation=_truncation(p)
    ),
    CrossEncoder.task: lambda core, meta, m, i, p, cache, rid: core.score(
        meta, list(zip(i["query"], i["document"], strict=True)), m, cache, truncation=_truncation(p)
    ),
    Translator.task: lambda core, meta, m, i, p, cache, rid: core.translate(
        meta, i["text"], decoding_params(**p), m, cache
    ),
    Generator.task: lambda core, meta, m, i, p, cache, rid: core.generate(
        meta, i["prompt"], sampling_params(**p), m, cache, rid
    ),
}
