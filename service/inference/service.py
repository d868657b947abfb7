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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal, Protocol, TypeVar

from service.access.quotas import Quotas
from service.cache import blob_digest
from service.cache.response_cache import BYPASS, USE_CACHE, CacheControl, ResponseCache
from service.context import current_key
from service.engine.sampling import SamplingParams
from service.errors import (
    ForbiddenError,
    InvalidInputError,
    ModelNotFoundError,
    NotReadyError,
)
from service.models.registry import ModelRegistry
from service.models.states import ModelState
from service.observe import spans
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

from .limits import CONTEXTS, RequestLimits
from .models import ServedModel
from .params import decoding_params, sampling_params
from .streams import GenerationStreams

log = logging.getLogger(__name__)

Phase = Literal["starting", "ready", "draining", "stopping", "stopped"]
P = TypeVar("P", bound=ModelPipeline)
R = TypeVar("R")

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

    def repository(self) -> list[ModelState]:
        return self.host.repository()

    async def resident(self, model: str | None, task: str | None = None) -> None:
        """With a memory budget, the model a request names (or its task's default) loaded if it is not
        resident, once the caller's key is known to be allowed it: a key may not load (and so unload
        others for) a model it may not use (``ModelHost.resident``)."""
        name = self.host.target(model, task)
        if name is None:
            return
        if name not in self.registry.versions and self.host.loads_on_demand(name):
            self._allowed(name)
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

    def check_servable(self, name: str, version: str | None = None) -> None:
        """``ModelNotFoundError`` (404) unless model ``name`` (``version``) serves, or would load on its first
        request (a memory budget): what a door checks before it reads a body."""
        if name in self.registry.versions or not self.host.loads_on_demand(name):
            self.model(name, version=version)

    def model_ready(self, name: str, version: str | None = None) -> tuple[ServedModel | None, bool]:
        """Triton's model readiness: the resident model (None when not resident) and whether it answers now.
        A model the service knows (resident, refused, or a folder of the repository, loadable on demand or
        not) that is not resident, or not in that version, is not ready; a name it does not know is
        ``ModelNotFoundError`` (404, ``NOT_FOUND``)."""
        if name in self.registry.versions:
            try:
                model = self.model(name, version=version)
            except ModelNotFoundError:  # the model serves, that version does not
                return None, False
            return model, self.phase == "ready"
        if not self.host.knows(name):
            raise ModelNotFoundError(name, list(self.registry.versions))
        self._allowed(name)
        return None, False

    async def served(
        self, name: str | None, task: str | None = None, version: str | None = None
    ) -> ServedModel:
        """``model``, once the model is resident: with a memory budget, a model of the repository a request
        names is loaded on demand (``resident``) before the door reads it. What a door calls for a request."""
        await self.resident(name, task)
        return self.model(name, task, version)

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

    def _charge_abandoned(self, usage: Usage) -> None:
        """What a request that failed or whose caller left had used, charged in the background (its task is
        being cancelled): generated tokens are spent whether or not anyone read them."""
        if current_key() is None or self.quotas is None:
            return
        charging = asyncio.ensure_future(self._charge(usage))  # the request's context: its key
        self._charging.add(charging)
        charging.add_done_callback(self._charging.discard)

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
        await self.resident(model, kind.task)  # a key's model list is checked before any load (``resident``)
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
        pipeline, params = await self._generation(prompts, params, model, run)
        with pipeline.leased():

            def one(choice: SamplingParams) -> Awaitable[Outcome[Generation]]:
                return self._answer(
                    pipeline,
                    {"prompts": list(prompts), **asdict(choice)},
                    Generation,
                    cache if choice.is_deterministic else BYPASS,
                    lambda: pipeline.generate(prompts, choice, request_id, self._charge_abandoned),
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
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """A chat's messages as one prompt, by the model's chat template (then ``generate`` or
        ``open_streams`` it); InvalidInputError naming ``model`` when it has none, ``messages`` or a
        ``chat_template_kwargs`` key when the template cannot take them."""
        pipeline = await self._resolve(Generator, model)
        return pipeline.chat_prompt(messages, add_generation_prompt, template_kwargs or {})

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
