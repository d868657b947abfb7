"""The engine's workers as a front end's pipelines see them: the same calls, answered by the engine process.

A pipeline in a front end prepares its inputs (tokenizing, decoding images) and reads its outputs as in
one process; only where it hands work to its model's worker does the work cross to the engine:

- ``RemoteBatcher`` stands for a ``DynamicBatcher``: ``submit_all`` sends the items and awaits their
  results. Whether they fit is decided in one place, the engine's queue, as it admits them: there a more
  urgent request displaces less urgent work, exactly as in one process (a front end that refused by the
  depths it last heard would refuse high priority where one process displaces low);
- ``RemoteGenerationEngine`` stands for a ``GenerationEngine``: ``admit_all`` sends the requests and
  returns their streams once the engine has taken them, so a refusal is an ordinary error before any
  token; the grammars (structured output) and the vocabulary are checked here, as the pipeline asks.

What crosses is explicit (``messages.Asked``, from the ``RequestMeta`` each call is given): the request's
priority class and deadline, its trace context, its key's id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import propagate

from service.engine.errors import BatcherClosedError
from service.engine.generation_contract import GenerationRequest
from service.engine.generation_stream import GenerationStream
from service.engine.repository import LoadedModel
from service.engine.structured_output import GrammarCompiler
from service.engine.worker import Permit
from service.metadata import ANONYMOUS, RequestMeta
from service.settings import Settings

from .client import EngineClient
from .messages import Asked
from .payloads import results_of


def asked(meta: RequestMeta) -> Asked:
    """What the request carries, for the engine."""
    carrier: dict[str, str] = {}
    if meta.trace is not None:
        propagate.inject(carrier, context=meta.trace)
    request = meta.scheduling
    return Asked(request.priority, request.deadline, carrier or None, meta.key_id, request.most_urgent)


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

    def reserve(self, count: int, meta: RequestMeta = ANONYMOUS) -> Permit:
        """Refuse at once only while the engine is away: room in its queue, and displacement, are the
        engine's to decide as it admits the items (module docstring)."""
        if not self.client.up:
            raise BatcherClosedError(self.name, "the engine process is restarting")
        return _RemotePermit()  # type: ignore[return-value]

    async def start(self) -> None:
        pass

    async def stop(self, drain: bool = True, timeout_s: float = 0.0) -> None:
        pass


class RemoteBatcher(_Worker):
    """A model's dynamic batcher, in the engine process."""

    waiting = 0

    def __init__(self, client: EngineClient, model: LoadedModel, max_queue_size: int) -> None:
        super().__init__(client, model, max_queue_size)
        self.results = results_of(model.task)  # what the answers decode into

    async def submit_all(
        self,
        items: Sequence[Any],
        costs: Sequence[int],
        permit: Permit | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> list[Any]:
        results = await self.client.submit(self.name, self.version, items, costs, asked(meta), self.results)
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
        meta: RequestMeta = ANONYMOUS,
    ) -> list[GenerationStream]:
        return await self.client.generate(self.name, self.version, requests, asked(meta))
