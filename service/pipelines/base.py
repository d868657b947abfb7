"""The part every batched pipeline shares: one DynamicBatcher per model, all-or-nothing admission, await.

This is TEI's ``infer`` step: a request's items are admitted together or not
at all (a request never half-enters a queue), once: a ``Permit`` for all of
them is taken before their preprocessing and each item queued on it, with
its token cost; the caller awaits all of them. If the caller goes away
(its task is cancelled, e.g. the client disconnected), every item still
waiting is dropped before it reaches the model.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, cast

import numpy as np

from service.engine.batcher import BatcherObserver, BatchPolicy, DynamicBatcher
from service.engine.manifest import required
from service.engine.repository import LoadedModel
from service.engine.worker import Permit
from service.metadata import ANONYMOUS, RequestMeta
from service.observe.metrics import Metrics
from service.settings import Settings

from .attention import AttentionFeeds, AttentionMaps, Selection, wordpiece_labels
from .contract import TaskContract
from .local_workers import LOCAL
from .text_inputs import (
    CUT_RIGHT,
    EncodedText,
    Truncation,
    encode_texts,
    feeds_for,
    pad_batch,
    preprocess,
    truncate,
)

Item = TypeVar("Item")
Out = TypeVar("Out")


@dataclass(frozen=True)
class Building:
    """What a pipeline is built from besides its model: the settings, the metrics to observe it with, and
    the workers its model's work goes to (this process's, or a front end's way to the engine process)."""

    settings: Settings
    metrics: Metrics | None = None
    workers: Workers = LOCAL

    def policy(self) -> BatchPolicy:
        s = self.settings
        return BatchPolicy(
            max_batch_size=s.max_batch_size,
            max_batch_tokens=s.max_batch_tokens,
            max_queue_delay_ms=s.max_queue_delay_ms,
            max_queue_size=s.max_queue_size,
            queue_timeout_s=s.queue_timeout_s,
            split_ratio=s.batch_split_ratio,
            split_min_tokens=s.batch_split_min_tokens,
        )

    def batcher_observer(self, name: str) -> BatcherObserver | None:
        return self.metrics.batcher_observer(name) if self.metrics is not None else None


class Workers(Protocol):
    """The one way from a pipeline to compute, given to it when it is built: in this process
    (``local_workers.LocalWorkers``), or, for a front end of the split service, the engine process
    (``service/ipc``). A pipeline holds no model worker but what these give it."""

    def batcher(
        self,
        model: LoadedModel,
        run_batch: Callable[[list[Any]], Sequence[Any]],
        policy: BatchPolicy,
        observer: BatcherObserver | None,
    ) -> Any:
        """The model's dynamic batcher (or its stand-in): ``reserve``, ``submit_all``, start, stop."""

    def generation_engine(self, model: LoadedModel, settings: Settings, metrics: Metrics | None) -> Any:
        """A generation model's continuous batching (or its stand-in): ``admit_all``, start, stop."""

    async def compute(self, pipeline: ModelPipeline, method: str, *args: Any) -> Any:
        """Pipeline ``method``'s model-side function (``local_workers.COMPUTE``) on the model."""


class ModelPipeline(ABC):
    """One served model: its task-specific pre/post-processing and the engine that runs it.

    Each pipeline declares its task once: ``contract`` (its name as in the manifest, its default model,
    inputs, outputs and parameters: ``contract.py``) and ``build`` (the pipeline for a loaded model, from
    the settings); the factory, the registry and the tensor doors read them (``factory.PIPELINES``).
    """

    contract: ClassVar[TaskContract]
    task: str  # contract.task
    default_model: ClassVar[str]  # contract.default_model

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "contract" in cls.__dict__:
            cls.task = cls.contract.task
            cls.default_model = cls.contract.default_model

    @classmethod
    @abstractmethod
    def build(cls, model: LoadedModel, building: Building) -> ModelPipeline:
        """The pipeline for ``model``, configured from ``building``'s settings."""

    def __init__(self, model: LoadedModel) -> None:
        assert model.task == self.task, f"{type(self).__name__} serves {self.task}, not {model.task}"
        self.model = model
        self._users = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def leased(self) -> Iterator[Self]:
        """Held by each request from the moment it resolves this model until its work is done or queued:
        a replaced or unloaded pipeline stops once none holds it (``InferenceService`` retires it)."""
        self._users += 1
        self._idle.clear()
        try:
            yield self
        finally:
            self._users -= 1
            if not self._users:
                self._idle.set()

    async def idle(self) -> None:
        """Until no request holds this pipeline."""
        await self._idle.wait()

    @property
    def held(self) -> bool:
        """A request holds it (``leased``): ``idle()`` waits for that to end."""
        return self._users > 0

    @property
    def busy(self) -> bool:
        """A request holds it, or work it queued is not done (a stream's sequences outlive its lease)."""
        return self._users > 0 or self.pending > 0

    @property
    def pending(self) -> int:
        """Work queued or running beyond the requests that hold the pipeline (none but for streams)."""
        return 0

    def waiting_by_class(self) -> dict[int, int]:
        """Items waiting in this model's queue, by priority class (what the engine process publishes)."""
        return {}

    @property
    def name(self) -> str:
        return self.model.name

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self, timeout_s: float) -> None: ...

    @abstractmethod
    async def warmup(self) -> None:
        """One real, small inference through the whole path, so the first client pays no start-up cost."""


class BatchedPipeline(ModelPipeline, Generic[Item, Out]):
    """A pipeline whose model calls go through a dynamic batcher; subclasses supply ``run_batch``."""

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        observer: BatcherObserver | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model)
        self.workers = workers if workers is not None else LOCAL  # where the model runs
        self.batcher: DynamicBatcher[Item, Out] = self.workers.batcher(
            model, self.run_batch, policy, observer
        )
        self.attention_maps = AttentionMaps(model)

    @abstractmethod
    def run_batch(self, items: list[Item]) -> Sequence[Out | BaseException]:
        """Blocking: run the model over ``items`` (one batch) and return one result or error per item."""

    async def start(self) -> None:
        await self.batcher.start()

    def waiting_by_class(self) -> dict[int, int]:
        return self.batcher.waiting_by_class()

    async def in_compute_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this model's compute thread (between its batches), never on the event loop."""
        return await self.batcher.in_compute_thread(fn, *args)

    async def attention_weights(self, feeds: dict[str, np.ndarray], selection: Selection) -> np.ndarray:
        """The attention graph's weights for one input (``attention.with_attention``), on the model's compute
        thread: this process's, or the engine process's for a front end's view."""
        return cast(np.ndarray, await self.workers.compute(self, "attention_weights", feeds, selection))

    async def stop(self, timeout_s: float) -> None:
        await self.batcher.stop(drain=True, timeout_s=timeout_s)

    async def infer(
        self,
        items: Sequence[Item],
        costs: Sequence[int],
        permit: Permit | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> list[Out]:
        """Queue every item (cost = its token length) and wait for all results, in order.

        ``permit``: the places the request took before its preprocessing (``batcher.reserve``), one per
        item; without one, they are taken here (at ``meta``'s priority class). Raises ``QueueFullError`` at once when the queue cannot
        take all items; if one item fails, the others are withdrawn and the error propagates.
        """
        with (
            contextlib.nullcontext(permit)
            if permit is not None
            else self.batcher.reserve(len(items), meta) as held
        ):
            return await self.batcher.submit_all(items, costs, held, meta)


class TextEncoderPipeline(BatchedPipeline[Item, Out]):
    """A BERT head's pipeline: its tokenizer, window and [PAD], and right-padded batches through its one graph."""

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        observer: BatcherObserver | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model, policy, observer, workers)
        assert model.tokenizer is not None, "text model without a tokenizer"
        self.tokenizer = model.tokenizer
        self.max_len = required(model.manifest.max_sequence_length)
        self.pad_id = model.manifest.token("pad")
        self.graph = model.graphs["model"]

    def run_padded(self, rows: list[list[int]], type_rows: list[list[int]] | None = None) -> list[np.ndarray]:
        """The graph's outputs for ``rows`` of token ids (and segment ids), right-padded into one batch."""
        return self.graph.run(feeds_for(self.graph, pad_batch(rows, self.pad_id, type_rows)))

    def token_feeds(self, ids: list[int], type_ids: list[int] | None = None) -> AttentionFeeds:
        """One input's feeds for the attention graph, labelled with its own tokens (a token x token map)."""
        feeds = pad_batch([ids], self.pad_id, None if type_ids is None else [type_ids])
        labels = wordpiece_labels(self.tokenizer, ids)
        return AttentionFeeds(feeds, "self", labels, labels)


class TextPipeline(TextEncoderPipeline[list[int], Out]):
    """A head whose item is one text's token ids (classify, tag, embed).

    ``encode`` cuts each text to the window as ``truncation`` says (a head that keeps more of each text,
    such as its words' offsets, overrides it); ``run_texts`` admits, encodes and runs a request's texts.
    """

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> Self:
        return cls(model, building.policy(), building.batcher_observer(model.name), building.workers)

    def encode(self, texts: Sequence[str], truncation: Truncation = CUT_RIGHT) -> Sequence[EncodedText]:
        """Each text's ids, cut to the model's window (``truncated`` says which were), or refused."""
        return [
            EncodedText(truncate(e.ids, self.max_len, truncation, i), len(e.ids) > self.max_len)
            for i, e in enumerate(encode_texts(self.tokenizer, texts))
        ]

    async def run_texts(
        self, texts: Sequence[str], truncation: Truncation = CUT_RIGHT, meta: RequestMeta = ANONYMOUS
    ) -> tuple[Sequence[Any], list[Out]]:
        """Every text's encoding and model output: all admitted at once, before tokenisation is paid for."""
        with self.batcher.reserve(len(texts), meta) as permit:
            encoded = await preprocess(sum(map(len, texts)), self.encode, texts, truncation)
            outs = await self.infer([e.ids for e in encoded], [len(e.ids) for e in encoded], permit, meta)
        return encoded, outs

    def attention_length(self, text: str) -> tuple[int, str]:
        return len(self.encode([text])[0].ids), "inputs"
