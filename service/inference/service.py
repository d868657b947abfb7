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

Errors name the core's parameter (``inputs``, ``contexts``, ``max_new_tokens``,
``model``...) and the item's index; each door renames them (``api/http/fields.py``).

Phases: starting -> ready -> draining (SIGTERM: new requests get 503, the
ones in flight finish) -> stopping -> stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, TypeVar

from service import spans
from service.cache import blob_digest
from service.cache.response_cache import BYPASS, USE_CACHE, CacheControl, ResponseCache
from service.context import current_key
from service.engine.sampling import SamplingParams
from service.engine.variants import ServedVariant
from service.errors import (
    ControlOffError,
    ForbiddenError,
    InvalidInputError,
    ModelLoadFailedError,
    ModelUnavailableError,
    NotReadyError,
    ServiceError,
)
from service.memory import resident_bytes, trim_now
from service.pipelines import attention as attention_step
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
    Usage,
)
from service.pipelines.translate import DecodingParams, Translator
from service.quotas import Quotas

from .limits import CONTEXTS, RequestLimits
from .loading import Loader
from .memory_budget import MemoryBudget
from .models import ServedModel
from .params import decoding_params, sampling_params
from .registry import PREFERRED_DEFAULTS, ModelRegistry
from .streams import GenerationStreams

log = logging.getLogger(__name__)

Phase = Literal["starting", "ready", "draining", "stopping", "stopped"]
P = TypeVar("P", bound=ModelPipeline)
R = TypeVar("R")

# A generation request that names no length gets this many new tokens (at most MAX_NEW_TOKENS).
DEFAULT_MAX_NEW_TOKENS = 64


class ModelObserver(Protocol):
    """What the core reports of the models it serves (``service.metrics.Metrics``)."""

    def served(self, model: str, version: str, task: str, provider: str, variant: ServedVariant) -> None: ...

    def retired(self, model: str, version: str) -> None: ...

    def loaded(self, model: str, result: str, seconds: float) -> None: ...

    def resident(self, model: str, version: str, size: int | None) -> None: ...

    def evicted(self, model: str) -> None: ...


@dataclass(frozen=True)
class ModelState:
    """One model of the repository as the repository index shows it (Triton's states)."""

    name: str
    version: str | None
    state: Literal["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]
    reason: str = ""


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        cache: ResponseCache,
        limits: RequestLimits,
        loader: Loader | None = None,
        observer: ModelObserver | None = None,
        retire_timeout_s: float = 30.0,
        memory_budget: int = 0,
        load_timeout_s: float = 30.0,
        quotas: Quotas | None = None,
    ) -> None:
        self.registry = registry
        self.cache = cache
        self.limits = limits
        self.loader = loader  # None: the models are those of start-up (no load, no unload)
        self.observer = observer
        self.retire_timeout_s = retire_timeout_s  # how long a retired version may take to finish its work
        self.memory = MemoryBudget(memory_budget)
        self.load_timeout_s = load_timeout_s  # how long a request waits for its model to load (on demand)
        self._on_demand: dict[str, asyncio.Task[ServedModel]] = {}
        self.quotas = quotas  # API_KEYS_FILE: the caller's tokens are charged as its requests end
        self.phase: Phase = "starting"
        self._started: list[ModelPipeline] = []
        self._warmup = True
        self._loading: dict[str, asyncio.Lock] = {}
        self._retiring: dict[ModelPipeline, asyncio.Task[None]] = {}

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, warmup: bool) -> None:
        """Start every pipeline's engine, warm each up, and only then report ready.

        A model whose warm-up fails is stopped and refused (one log line), like a
        broken folder: the other models serve.
        """
        self._warmup = warmup
        for pipeline in self.registry.all_versions():
            if pipeline.name in self.registry.refused:
                continue  # another version of it failed
            await pipeline.start()
            self._started.append(pipeline)
            if not warmup:
                continue
            began = time.perf_counter()
            try:
                await pipeline.warmup()
            except Exception as exc:
                log.error("refusing model %s: warm-up failed: %r", pipeline.name, exc)
                for started in [p for p in self._started if p.name == pipeline.name]:
                    await started.stop(timeout_s=1.0)
                    self._started.remove(started)
                self.registry.refuse(pipeline.name, f"warm-up failed: {exc!r}")
                continue
            log.info("warmed up %s in %.2fs", pipeline.name, time.perf_counter() - began)
        for pipeline in self._started:
            self._served(pipeline)
        self.phase = "ready"

    def drain(self) -> None:
        """Refuse new requests (503 with Retry-After) while the ones in flight finish; readiness turns 503."""
        if self.phase in ("starting", "ready"):
            self.phase = "draining"

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, let each engine finish its work within ``timeout_s``; reverse start order."""
        self.phase = "stopping"
        for task in list(self._retiring.values()):
            task.cancel()
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

    @property
    def ready(self) -> bool:
        """Ready for inference, with at least one model to serve."""
        return self.phase == "ready" and bool(self.registry.pipelines)

    # --- the repository while serving: load (or reload), unload ---------------------------

    async def load(self, name: str, changed_only: bool = False, make_room: bool = True) -> ServedModel:
        """Load model ``name`` from its folder, or reload it when it serves: each version its policy serves
        is built and warmed up beside the serving ones, then they take every new request at once; each
        request that had resolved a replaced version finishes on it, and its sessions are freed when the
        last one ends. ``changed_only`` (poll mode) keeps the serving versions whose files are unchanged;
        ``make_room`` (with a memory budget) unloads idle models, least recently used first, so that it fits.
        A load that fails raises ``ModelLoadFailedError`` and leaves the serving versions as they were."""
        loader = self._control()
        lock = self._loading.setdefault(name, asyncio.Lock())
        async with lock, self.memory.measuring():  # one load of a name at a time; with a budget, of any
            began = time.perf_counter()
            serving = self.registry.versions.get(name, [])
            if make_room:
                await self._make_room(name, self.memory.expected(name, loader.disk_bytes(name)))
            before = resident_bytes()
            try:
                versions, built = await loader.build(name, serving if changed_only else [])
                for index, pipeline in enumerate(built):
                    try:
                        await self._start(pipeline)
                    except ModelLoadFailedError:
                        for other in built[index + 1 :]:
                            other.model.free()
                        for started in built[:index]:
                            self._retire(started)
                        raise
            except ModelLoadFailedError:
                self._observe_load(name, "failed", began)
                raise
            self._measured(name, built, resident_bytes() - before)
            if built or len(versions) != len(serving):
                replaced = self.registry.swap(name, versions)
                for pipeline in built:
                    self._served(pipeline)
                self._observe_load(name, "loaded", began)
                served = ", ".join(p.model.label or p.model.version for p in versions)
                log.info("%s serves %s (%d built, %d retiring)", name, served, len(built), len(replaced))
                for pipeline in replaced:
                    self._retire(pipeline)
            self.memory.touch(name)
            if make_room and self.memory.over():
                await self._make_room(name, 0)
            return ServedModel.of(versions[0], self.registry.default_for(name), versions)

    async def unload(self, name: str) -> None:
        """Stop serving model ``name``: new requests for it get 404; those it already has finish."""
        self._control()
        async with self._loading.setdefault(name, asyncio.Lock()):
            for pipeline in self.registry.remove(name):
                log.info(
                    "%s unloaded; version %s retires once its requests end", name, pipeline.model.version
                )
                self._retire(pipeline)

    def repository(self) -> list[ModelState]:
        """Every model the repository holds or this service serves, with its state and the reason."""
        states = {
            name: ModelState(name, versions[0].model.label or versions[0].model.version, "READY")
            for name, versions in self.registry.versions.items()
        }
        for name, reason in self.registry.refused.items():
            states.setdefault(name, ModelState(name, None, "UNAVAILABLE", reason))
        loader = self.loader
        for name in loader.folders() if loader is not None else []:
            on_demand = self.memory.enabled and loader is not None and loader.servable(name)
            reason = (
                "not resident: loads on its first request (MODEL_MEMORY_BUDGET)" if on_demand else "unloaded"
            )
            states.setdefault(name, ModelState(name, None, "UNAVAILABLE", reason))
        for name, lock in self._loading.items():
            if lock.locked():
                served = states.get(name)
                states[name] = ModelState(name, served.version if served else None, "LOADING")
        return [states[name] for name in sorted(states)]

    def _control(self) -> Loader:
        if self.loader is None:
            raise ControlOffError("the model repository is fixed at start-up (MODEL_CONTROL_MODE=none)")
        return self.loader

    async def _start(self, pipeline: ModelPipeline) -> None:
        """Start and warm up a new pipeline; one that fails is stopped, freed and refused."""
        try:
            await pipeline.start()
            if self._warmup:
                await pipeline.warmup()
        except Exception as exc:
            log.error("refusing the new version of %s: warm-up failed: %r", pipeline.name, exc)
            await pipeline.stop(timeout_s=1.0)
            pipeline.model.free()
            raise ModelLoadFailedError(pipeline.name, f"warm-up failed: {exc!r}") from exc
        self._started.append(pipeline)

    def _retire(self, pipeline: ModelPipeline) -> None:
        self._retiring[pipeline] = asyncio.ensure_future(self._retire_when_idle(pipeline))

    async def _retire_when_idle(self, pipeline: ModelPipeline) -> None:
        """Once no request holds it, let its engine finish what it has queued, then free its sessions."""
        try:
            await pipeline.idle()
            await pipeline.stop(self.retire_timeout_s)
        finally:
            if pipeline in self._started:
                self._started.remove(pipeline)
            pipeline.model.free()
            self._retiring.pop(pipeline, None)
            self.memory.forget(pipeline)
            if self.observer is not None:
                self.observer.retired(pipeline.name, pipeline.model.version)
                self.observer.resident(pipeline.name, pipeline.model.version, None)
            log.info("%s version %s retired: its sessions are freed", pipeline.name, pipeline.model.version)

    # --- more models than memory (MODEL_MEMORY_BUDGET) ---------------------------------------

    async def resident(self, model: str | None, task: str | None = None) -> None:
        """With a memory budget: load model ``model`` (``name[@version]``; None: ``task``'s default) if it is
        in the repository but not resident, the request waiting at most ``load_timeout_s`` (then 503 with
        Retry-After); mark it used. Without a budget, or for a resident model, nothing but that mark."""
        if model is None:
            if task is None or task in self.registry.defaults:
                if task is not None:
                    self.memory.touch(self.registry.defaults[task])
                return
            if not self.memory.enabled or self.loader is None:
                return  # the lookup that follows answers 404
            model = self.loader.default_for(task, PREFERRED_DEFAULTS.get(task))
            if model is None:
                return
        name = model.split("@", 1)[0]
        if name in self.registry.versions:
            self.memory.touch(name)
            return
        if not self.memory.enabled or self.loader is None:
            return  # the lookup that follows answers 404
        if not self.loader.servable(name):
            return  # the lookup that follows answers 404
        loading = self._on_demand.get(name)
        if loading is None or loading.done():
            loading = self._on_demand[name] = asyncio.ensure_future(self.load(name, changed_only=True))
        try:
            await asyncio.wait_for(asyncio.shield(loading), self.load_timeout_s)
        except TimeoutError as exc:
            raise ModelUnavailableError(
                f"model {name!r} is loading (it was not resident) and took longer than QUEUE_TIMEOUT_S"
            ) from exc
        except ModelLoadFailedError as exc:
            raise ModelUnavailableError(f"model {name!r} could not be loaded: {exc.reason}") from exc

    async def preload(self, names: list[str]) -> None:
        """At start-up with a memory budget: load the models in turn while each fits; the others load on
        their first request."""
        assert self.loader is not None, "a budget loads models itself"
        for name in names:
            expected = self.memory.expected(name, self.loader.disk_bytes(name))
            if self.memory.used() + expected > self.memory.budget:
                log.info("%s loads on its first request (MODEL_MEMORY_BUDGET)", name)
                continue
            try:
                await self.load(name, make_room=False)
            except ServiceError as exc:
                log.error("refusing model %s: %s", name, exc)
                self.registry.refused[name] = str(exc)
                continue
            if self.memory.over():  # measured larger than it looked: it waits for its first request
                log.info("%s loads on its first request: it does not fit MODEL_MEMORY_BUDGET now", name)
                for pipeline in self.registry.remove(name):
                    self._retire(pipeline)
                    self.memory.forget(pipeline)

    async def _make_room(self, name: str, needed: int) -> None:
        """Unload idle models, least recently used first, until ``needed`` more bytes fit the budget."""
        if not self.memory.enabled:
            return
        while self.memory.used() + needed > self.memory.budget:
            idle = [
                n
                for n, versions in self.registry.versions.items()
                if n != name and not any(p.busy for p in versions) and n not in self._on_demand_loading()
            ]
            if not idle:
                if needed and self.memory.used() + needed > self.memory.budget:
                    raise ModelUnavailableError(
                        f"model {name!r} does not fit MODEL_MEMORY_BUDGET beside the models at work"
                    )
                return
            victim = min(idle, key=self.memory.last_used)
            log.info("%s: unloaded to make room for %s (MODEL_MEMORY_BUDGET)", victim, name)
            evicted = self.registry.remove(victim)
            for pipeline in evicted:
                self._retire(pipeline)
                self.memory.forget(pipeline)  # counted out now
            # idle, so retired at once: its memory is freed (and handed back) before the next is measured
            await asyncio.gather(*(self._retiring[p] for p in evicted if p in self._retiring))
            trim_now()
            if self.observer is not None:
                self.observer.evicted(victim)

    def _on_demand_loading(self) -> set[str]:
        return {n for n, task in self._on_demand.items() if not task.done()}

    def _measured(self, name: str, built: list[ModelPipeline], grown: int) -> None:
        """Record what the versions just built hold resident: the process's growth while they loaded."""
        if not built or not self.memory.enabled:
            return
        share = max(0, grown) // len(built)
        for pipeline in built:
            model = pipeline.model
            floor = sum(g.path.stat().st_size for g in [*model.graphs.values(), *model.inplace.values()])
            counted = self.memory.record(pipeline, share, floor)
            if self.observer is not None:
                self.observer.resident(name, pipeline.model.version, counted)

    async def retired(self) -> None:
        """Until every replaced or unloaded version has stopped and freed its sessions (for tests, drains)."""
        while self._retiring:
            await asyncio.gather(*self._retiring.values(), return_exceptions=True)

    def _served(self, pipeline: ModelPipeline) -> None:
        if self.observer is not None:
            m = pipeline.model
            self.observer.served(m.name, m.version, m.task, m.provider, m.variant)

    def _observe_load(self, name: str, result: str, began: float) -> None:
        if self.observer is not None:
            self.observer.loaded(name, result, time.perf_counter() - began)

    # --- what the doors may know of the models --------------------------------------------

    def models(self) -> list[ServedModel]:
        """Each served model, as its newest version (``versions``: all that serve)."""
        return [self._view(versions[0]) for versions in self.registry.versions.values()]

    def _view(self, pipeline: ModelPipeline) -> ServedModel:
        return ServedModel.of(
            pipeline, self.registry.default_for(pipeline.name), self.registry.versions.get(pipeline.name, [])
        )

    def refused(self) -> dict[str, str]:
        """Folders refused at start-up (or at warm-up), with the reason as callers may see it (no host paths)."""
        return dict(sorted(self.registry.refused.items()))

    def model(self, name: str | None, task: str | None = None, version: str | None = None) -> ServedModel:
        """The loaded model ``name`` (default: ``task``'s default model), its newest version; with
        ``version`` (a version folder's number, or the content hash answers carry), that version, if it
        serves; with ``task``, only if it serves that task."""
        if task is not None:
            pipeline = self.registry.resolve_task(task, name)
        else:
            assert name is not None, "a model by name, or a task's default"
            pipeline = self.registry.get(name)
        if version is not None:
            pipeline = self.registry.get(pipeline.name, version)
        self._allowed(pipeline.name)
        return self._view(pipeline)

    # --- one method per task --------------------------------------------------------------

    async def _answer(
        self,
        pipeline: P,
        request: dict[str, Any],
        result_type: type[R],
        cache: CacheControl,
        compute: Callable[[], Awaitable[Outcome[R]]],
    ) -> Outcome[R]:
        """The answer, from the cache or computed, charged to the caller's key unless cached: the core's
        span of the request (named for its task), whose children are the cache lookup, the tokenizing and
        the queue wait."""
        with spans.span(pipeline.task, pipeline.model.request_span_attributes):
            outcome = await self.cache.get_or_compute(
                pipeline, request=request, result_type=result_type, control=cache, compute=compute
            )
        if not outcome.cached:
            await self._charge(outcome.usage)
        return outcome

    async def _charge(self, usage: Usage) -> None:
        """The tokens the caller's key read and generated, against its tokens per minute."""
        key = current_key()
        if key is not None and self.quotas is not None:
            await self.quotas.charge(key, usage.input_tokens + usage.output_tokens)

    @staticmethod
    def _allowed(name: str) -> None:
        """A model the caller's key may not use is a 403 (the key is known; the model is not its to use)."""
        key = current_key()
        if key is not None and not key.may_use(name):
            raise ForbiddenError(f"key {key.id!r} may not use model {name!r}", field="model")

    async def _resolve(self, kind: type[P], model: str | None) -> P:
        """After the request's own checks: readiness, then the model (``model``, or the task's default),
        loaded first if it is in the repository but not resident (``resident``).

        The caller holds ``pipeline.leased()`` while it uses it: a version replaced or unloaded meanwhile
        (``load``, ``unload``) stops, and frees its sessions, only once every request on it is done."""
        self.check_ready()
        await self.resident(model, kind.task)
        pipeline = self.registry.resolve(kind, model)
        self._allowed(pipeline.name)
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
        texts: Sequence[str],
        params: DecodingParams,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Translation]:
        self._texts(texts, attention)
        self.limits.new_tokens(params.max_new_tokens)
        self.limits.generation_budget(len(texts), params.max_new_tokens, params.beam_size)
        pipeline = await self._resolve(Translator, model)
        with pipeline.leased():
            if attention is not None:
                params = pipeline.attention_params(texts[0], params, self.limits.attention_max_tokens)
            return await self._with_attention(
                pipeline,
                attention,
                texts,
                {"texts": list(texts), **asdict(params)},
                Translation,
                cache,
                lambda: pipeline.translate(texts, params),
            )

    async def classify_texts(
        self,
        texts: Sequence[str],
        top_k: int | None = None,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Classification]:
        """``top_k`` None: every label, most probable first."""
        self._texts(texts, attention)
        pipeline = await self._resolve(TextClassifier, model)
        with pipeline.leased():
            k = len(pipeline.labels) if top_k is None else top_k
            return await self._with_attention(
                pipeline,
                attention,
                texts,
                {"texts": list(texts), "top_k": k},
                Classification,
                cache,
                lambda: pipeline.classify(texts, k),
            )

    async def classify_images(
        self,
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
        pipeline = await self._resolve(ImageClassifier, model)
        with pipeline.leased():
            k = len(pipeline.labels) if top_k is None else top_k
            return await self._with_attention(
                pipeline,
                attention,
                images,
                {"images": [blob_digest(image) for image in images], "top_k": k},
                Classification,
                cache,
                lambda: pipeline.classify(images, k),
            )

    async def answer(
        self,
        pairs: Sequence[tuple[str, str]],
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Answer]:
        """``pairs``: (question, context); errors name ``inputs`` (the questions) or ``contexts``."""
        self._texts([q for q, _ in pairs], attention)
        self.limits.texts([c for _, c in pairs], CONTEXTS)
        pipeline = await self._resolve(QuestionAnswerer, model)
        with pipeline.leased():
            return await self._with_attention(
                pipeline,
                attention,
                pairs,
                {"pairs": [list(pair) for pair in pairs]},
                Answer,
                cache,
                lambda: pipeline.answer(pairs),
            )

    async def entities(
        self,
        texts: Sequence[str],
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        attention: AttentionQuery | None = None,
    ) -> Outcome[Entities]:
        self._texts(texts, attention)
        pipeline = await self._resolve(EntityTagger, model)
        with pipeline.leased():
            return await self._with_attention(
                pipeline,
                attention,
                texts,
                {"texts": list(texts)},
                Entities,
                cache,
                lambda: pipeline.tag(texts),
            )

    async def _with_attention(
        self,
        pipeline: Any,
        attention: AttentionQuery | None,
        inputs: Sequence[Any],
        request: dict[str, Any],
        result_type: type[R],
        cache: CacheControl,
        compute: Callable[[], Awaitable[Outcome[R]]],
    ) -> Outcome[R]:
        """The answer, through the cache; with ``attention``, the attention step after it, uncached."""
        if attention is None:
            return await self._answer(pipeline, request, result_type, cache, compute)
        return await attention_step.with_attention(
            pipeline,
            attention,
            inputs[0],
            self.limits.attention_max_tokens,
            # the rule: a request with return_attention never reads nor writes the response cache
            lambda: self._answer(pipeline, request, result_type, BYPASS, compute),
        )

    async def embed(
        self,
        texts: Sequence[str],
        normalize: bool = True,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        dimensions: int | None = None,
    ) -> Outcome[Embedding]:
        """``dimensions``, when given, must be the model's own (its embeddings were not trained to be cut)."""
        self._texts(texts)
        pipeline = await self._resolve(SentenceEmbedder, model)
        with pipeline.leased():
            if dimensions is not None and dimensions != pipeline.dimensions:
                raise InvalidInputError(
                    f"model {pipeline.name!r} makes {pipeline.dimensions}-dimensional embeddings and does not "
                    "support other sizes (it was not trained for shortened, Matryoshka embeddings)",
                    "dimensions",
                    "unsupported",
                )
            return await self._answer(
                pipeline,
                {"texts": list(texts), "normalize": normalize},
                Embedding,
                cache,
                lambda: pipeline.embed(texts, normalize),
            )

    # --- any task, in its contract's terms ------------------------------------------------

    async def infer(
        self,
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
        await self.resident(model)
        task = self.model(model).task
        return await _BY_TASK[task](self, model, inputs, dict(parameters), cache, request_id)

    # --- generation -----------------------------------------------------------------------

    async def _generation(
        self, prompts: Sequence[str], params: SamplingParams, model: str | None, choices: int
    ) -> tuple[Generator, SamplingParams]:
        """Readiness, limits and the default length, then the model."""
        self._texts(prompts)
        self.limits.new_tokens(params.max_new_tokens)
        if params.max_new_tokens is None:
            default = min(DEFAULT_MAX_NEW_TOKENS, self.limits.max_new_tokens)
            params = dataclasses.replace(params, max_new_tokens=default)
        self.limits.generation_budget(len(prompts) * choices, params.max_new_tokens)
        return await self._resolve(Generator, model), params

    async def generate(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None = None,
        cache: CacheControl = USE_CACHE,
        request_id: str = "",
        choices: int = 1,
    ) -> Outcome[Generation]:
        """``choices`` per prompt, all decoding together in the running batch; results prompt-major (prompt
        ``p``, choice ``c`` at ``p * choices + c``); choice ``c`` of a seeded request samples with
        ``seed + c``. Each choice is cached only when deterministic (greedy or seeded)."""
        pipeline, params = await self._generation(prompts, params, model, choices)
        with pipeline.leased():

            def one(choice: SamplingParams) -> Awaitable[Outcome[Generation]]:
                return self._answer(
                    pipeline,
                    {"prompts": list(prompts), **asdict(choice)},
                    Generation,
                    cache if choice.is_deterministic else BYPASS,
                    lambda: pipeline.generate(prompts, choice, request_id),
                )

            if choices == 1:  # no extra task: the sequences reach the engine as early as possible
                return await one(params)
            tasks = [asyncio.ensure_future(one(params.for_choice(c))) for c in range(choices)]
            try:
                outcomes = await asyncio.gather(*tasks)
            except BaseException:  # any failure cancels the other choices
                for task in tasks:
                    task.cancel()
                raise
            results = [o.results[p] for p in range(len(prompts)) for o in outcomes]
            return Outcome(
                pipeline.name,
                pipeline.model.version,
                results,
                Usage.of_generations(results, choices),
                cached=all(o.cached for o in outcomes),
            )

    async def open_streams(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None = None,
        request_id: str = "",
        choices: int = 1,
    ) -> GenerationStreams:
        """Live token streams, ``choices`` per prompt (prompt-major), all admitted or none. Never cached: a
        stream's point is tokens as the model makes them. The caller cancels them if it stops reading."""
        pipeline, params = await self._generation(prompts, params, model, choices)
        with pipeline.leased():
            opened: list[OpenStream] = []
            try:
                for index, prompt in enumerate(prompts):
                    for c in range(choices):
                        try:
                            opened.append(
                                await pipeline.open_stream(prompt, params.for_choice(c), request_id)
                            )
                        except InvalidInputError as exc:
                            exc.index = index
                            raise
            except BaseException:
                for stream in opened:
                    stream.cancel()
                raise
            return GenerationStreams(pipeline.name, pipeline.model.version, opened, choices, self._charge)


_TaskCall = Callable[
    [InferenceService, str, Mapping[str, Sequence[Any]], dict[str, Any], CacheControl, str],
    Awaitable[Outcome[Any]],
]

# task -> its method, from the contract's inputs (by name) and the core's parameters (``infer``)
_BY_TASK: dict[str, _TaskCall] = {
    TextClassifier.task: lambda core, m, i, p, cache, rid: core.classify_texts(i["text"], None, m, cache),
    ImageClassifier.task: lambda core, m, i, p, cache, rid: core.classify_images(i["image"], None, m, cache),
    QuestionAnswerer.task: lambda core, m, i, p, cache, rid: core.answer(
        list(zip(i["question"], i["context"], strict=True)), m, cache
    ),
    EntityTagger.task: lambda core, m, i, p, cache, rid: core.entities(i["text"], m, cache),
    SentenceEmbedder.task: lambda core, m, i, p, cache, rid: core.embed(
        i["text"], p.get("normalize", True), m, cache
    ),
    Translator.task: lambda core, m, i, p, cache, rid: core.translate(
        i["text"], decoding_params(**p), m, cache
    ),
    Generator.task: lambda core, m, i, p, cache, rid: core.generate(
        i["prompt"], sampling_params(**p), m, cache, rid
    ),
}
