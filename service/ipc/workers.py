"""The engine's workers as a front end's pipelines see them: the same calls, answered by the engine process.

A pipeline in a front end prepares its inputs (tokenizing, decoding images) and reads its outputs as in
one process; only where it hands work to its model's worker does the work cross to the engine:

- ``RemoteBatcher`` stands for a ``DynamicBatcher``: ``reserve`` refuses at once a request the engine's
  queue has no room for, by the queue depths the engine publishes (the engine checks again, exactly, as
  it queues); ``submit_all`` sends the items and awaits their results;
- ``RemoteGenerationEngine`` stands for a ``GenerationEngine``: ``admit_all`` sends the requests and
  returns their streams once the engine has taken them, so a refusal is an ordinary error before any
  token; the grammars (structured output) and the vocabulary are checked here, as the pipeline asks.

What crosses is explicit (``messages.Asked``): the request's priority class and deadline, its trace
context, its key's id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import propagate
from opentelemetry.context import Context

from service.context import current_key
from service.engine import scheduling
from service.engine.errors import BatcherClosedError, QueueFullError
from service.engine.generation_contract import GenerationRequest
from service.engine.generation_stream import GenerationStream
from service.engine.repository import LoadedModel
from service.engine.structured_output import GrammarCompiler
from service.engine.worker import Permit
from service.observe import spans
from service.settings import Settings

from .client import EngineClient
from .messages import Asked


def asked(request: scheduling.Scheduling | None = None, trace: Context | None = None) -> Asked:
    """What the current request carries, for the engine."""
    request = scheduling.current() if request is None else request
    trace = spans.current_context() if trace is None else trace
    carrier: dict[str, str] = {}
    if trace is not None:
        propagate.inject(carrier, context=trace)
    key = current_key()
    return Asked(request.priority, request.deadline, carrier or None, key.id if key is not None else None)


class _RemotePermit:
    """A request's places, counted by the engine when its items are queued: here only a context."""

    def __enter__(self) -> _RemotePermit:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def check(self) -> None:
        pass

    def use(self) -> None:
        pass


class _Worker:
    def __init__(self, client: EngineClient, model: LoadedModel, max_queue_size: int) -> None:
        self.client = client
        self.name = model.name
        self.version = model.version
        self.max_queue_size = max_queue_size

    def reserve(self, count: int) -> Permit:
        """Refuse at once (``QueueFullError``) a request for which the engine's queue has no room now, by
        the depths it last published (every quarter second); the engine checks again as it queues."""
        if not self.client.up:
            raise BatcherClosedError(self.name, "the engine process is restarting")
        waiting = sum(self.client.depth.get(self.name, {}).values())
        if waiting + count > self.max_queue_size:
            raise QueueFullError(self.name, waiting, 1)
        return _RemotePermit()  # type: ignore[return-value]

    async def start(self) -> None:
        pass

    async def stop(self, drain: bool = True, timeout_s: float = 0.0) -> None:
        pass


class RemoteBatcher(_Worker):
    """A model's dynamic batcher, in the engine process."""

    waiting = 0

    async def submit_all(
        self,
        items: Sequence[Any],
        costs: Sequence[int],
        permit: Permit | None = None,
        request: scheduling.Scheduling | None = None,
        trace: Context | None = None,
    ) -> list[Any]:
        results = await self.client.submit(self.name, self.version, items, costs, asked(request, trace))
        if len(results) != len(items):
            raise RuntimeError(f"the engine answered {len(results)} results for {len(items)} items")
        return results


class RemoteGenerationEngine(_Worker):
    """A generation model's continuous batching, in the engine process."""

    running = 0
    waiting = 0

    def __init__(self, client: EngineClient, model: LoadedModel, settings: Settings) -> None:
        super().__init__(client, model, settings.max_queue_size)
        assert model.tokenizer is not None, f"{model.name} has no tokenizer"
        manifest = model.manifest
        self.eos_id = manifest.token("eos")
        self.vocab_size = int(manifest.config.get("vocab_size") or model.tokenizer.get_vocab_size())
        self.grammars = GrammarCompiler(model.tokenizer, self.vocab_size, self.eos_id)

    async def admit_all(
        self,
        requests: Sequence[GenerationRequest],
        permit: Permit | None = None,
        asked_for: scheduling.Scheduling | None = None,
        trace: Context | None = None,
    ) -> list[GenerationStream]:
        return await self.client.generate(self.name, self.version, requests, asked(asked_for, trace))
