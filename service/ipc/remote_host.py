"""A front end's model host: a mirror of the engine process's models, and the calls that change them.

The engine broadcasts what serves after every change (``Models``). For each version it names, the
front end builds its own view: the manifest and tokenizer read from the version's folder, the pipeline
of its task built over them with remote workers (``workers.py``) and no session (``load_view``). A
version is routed to only once its view is built: a front end never sends a request for a version whose
tokenizer it does not have, and the cache key still names the version. A view the engine no longer names
is dropped. Loads and unloads (the repository's routes) and on-demand loads (a memory budget) are calls
to the engine; each answers with the ``Models`` generation holding its effect, and the call returns once
this front end's mirror has reached it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal, cast

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.repository import LoadedModel, load_view
from service.engine.versions import VersionFolder
from service.errors import ModelNotFoundError
from service.models.registry import ModelLookup, ModelRegistry
from service.models.served import ServedModel
from service.models.states import ModelState
from service.observe.metrics import Metrics
from service.pipelines.base import ModelPipeline
from service.pipelines.factory import build_pipeline
from service.settings import Settings

from .client import EngineClient
from .messages import Models, ModelVersion
from .workers import RemoteBatcher, RemoteGenerationEngine

log = logging.getLogger(__name__)


class _Broadcast:
    """The repository's offer as the engine last broadcast it (``Models``), which it built with the same
    ``ModelLookup`` (``engine_host/server.py``)."""

    def __init__(self, host: RemoteHost) -> None:
        self.host = host

    def folders(self) -> Collection[str]:
        latest = self.host._latest
        return latest.folders if latest is not None else ()

    def on_demand(self, name: str) -> bool:
        latest = self.host._latest
        return latest is not None and name in latest.on_demand

    def default_for(self, task: str) -> str | None:
        latest = self.host._latest
        return latest.defaults.get(task) if latest is not None else None


class RemoteHost:
    def __init__(self, settings: Settings, folder: Path, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.registry = ModelRegistry([], {})
        self.lookup = ModelLookup(self.registry, _Broadcast(self))  # the engine's rules, over its broadcasts
        self.client = EngineClient(folder, self._models)
        self._views: dict[tuple[str, str], ModelPipeline] = {}  # (name, version hash) -> its view
        self._latest: Models | None = None
        self._updated = asyncio.Event()
        self.number = 0

    @property
    def up(self) -> bool:
        return self.client.up

    async def start(self, warmup: bool) -> None:
        """Connect, and wait for the engine's first word on what serves (its models load and warm up there)."""
        await self.client.start()
        if not await self.client.wait_up(timeout_s=self.settings.engine_start_timeout_s):
            log.error("the engine process did not answer within ENGINE_START_TIMEOUT_S")

    async def stop(self, timeout_s: float) -> None:
        await self.client.stop()

    # --- the mirror --------------------------------------------------------------------------------------

    def _models(self, message: Models) -> None:
        if message.number <= self.number and self._latest is not None and self.client.up:
            return
        self._latest = message
        by_name: dict[str, list[ModelVersion]] = {}
        for version in message.versions:
            by_name.setdefault(version.name, []).append(version)
        for name, versions in by_name.items():
            views = [view for v in versions if (view := self._view(v)) is not None]
            current = self.registry.versions.get(name, [])
            if [id(p) for p in views] != [id(p) for p in current] and views:
                self.registry.swap(name, views)
        for name in set(self.registry.versions) - set(by_name):
            self.registry.remove(name)
        self.registry.refused = dict(message.refused)
        keep = {(v.name, v.version) for v in message.versions}
        for key in set(self._views) - keep:
            del self._views[key]
        self.number = message.number
        self._updated.set()

    def _view(self, version: ModelVersion) -> ModelPipeline | None:
        key = (version.name, version.version)
        view = self._views.get(key)
        if view is not None:
            return view
        folder = Path(version.folder)
        label_folder = VersionFolder(version.label, folder / version.label) if version.label else None
        try:
            model = load_view(folder, label_folder, version.variant, version.provider)
            view = build_pipeline(model, self.settings, self.metrics, workers=self)
        except Exception as exc:  # a folder changed under us: the next broadcast tells again
            log.error("cannot build the view of %s version %s: %r", version.name, version.version, exc)
            return None
        self._views[key] = view
        return view

    # --- the workers a view pipeline is built with (pipelines/base.Workers) ---------------------------

    def batcher(
        self,
        model: LoadedModel,
        run_batch: Callable[[list[Any]], Sequence[Any]],
        policy: BatchPolicy,
        observer: BatcherObserver | None,
    ) -> RemoteBatcher:
        """The engine's batcher for ``model``: the engine process runs its batches (and observes them)."""
        return RemoteBatcher(self.client, model, self.settings.max_queue_size)

    async def compute(self, pipeline: ModelPipeline, method: str, *args: object) -> object:
        value, _ = await self.client.call("compute", pipeline.name, pipeline.model.version, method, args)
        return value

    def generation_engine(
        self, model: LoadedModel, settings: Settings, metrics: Metrics | None
    ) -> RemoteGenerationEngine:
        return RemoteGenerationEngine(self.client, model, settings)

    async def _until(self, number: int) -> None:
        """Until this front end's mirror holds the engine's ``Models`` generation ``number``."""
        deadline = time.monotonic() + 30
        while self.number < number:
            self._updated.clear()
            await asyncio.wait_for(self._updated.wait(), max(0.0, deadline - time.monotonic()))

    # --- what the core asks ------------------------------------------------------------------------------

    async def load(self, name: str) -> ServedModel:
        _, number = await self.client.call("load", name)
        await self._until(number)
        pipeline = self.registry.get(name)
        return ServedModel.of(pipeline, self.registry.default_for(name), self.registry.versions.get(name, []))

    async def unload(self, name: str) -> None:
        _, number = await self.client.call("unload", name)
        await self._until(number)

    def repository(self) -> list[ModelState]:
        if self._latest is None:
            return []
        return [
            ModelState(
                s.name,
                s.version,
                cast(Literal["READY", "LOADING", "UNLOADING", "UNAVAILABLE"], s.state),
                s.reason,
            )
            for s in self._latest.repository
        ]

    def target(self, model: str | None, task: str | None) -> str | None:
        return self.lookup.target(model, task)

    def loads_on_demand(self, name: str) -> bool:
        return self.lookup.loads_on_demand(name)

    def knows(self, name: str) -> bool:
        return self.lookup.knows(name)

    async def resident(self, model: str | None, task: str | None = None) -> None:
        name = self.target(model, task)
        if name is None or name in self.registry.versions or not self.loads_on_demand(name):
            return
        try:
            _, number = await self.client.call("resident", model, task)
        except ModelNotFoundError:
            return  # the lookup that follows answers 404
        await self._until(number)
