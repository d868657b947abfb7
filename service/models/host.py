"""The model host: the models this process runs, and their lifecycle (start, warm-up, load or reload while
serving, unload, retire, stop), with the memory budget's choices (``MODEL_MEMORY_BUDGET``: what loads on
demand, what is unloaded to make room) and the repository poller (``MODEL_CONTROL_MODE=poll``).

The inference core (``service/inference/service.py``) runs over a host: this one in a single process and
in the split service's engine process (``service/engine_host/``); a front end's ``RemoteHost``
(``service/ipc/remote_host.py``) mirrors the engine's and asks it for every change. Access (which key may
use which model) is the core's: it is checked before the core asks for a load (``InferenceService.resident``).

A version that is replaced or unloaded retires: new requests no longer reach it, each request that had
resolved it finishes on it, and its sessions are freed once the last one ends (``pipeline.leased()``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection
from typing import Protocol

from service.engine.variants import ServedVariant
from service.errors import (
    ControlOffError,
    ModelLoadFailedError,
    ModelTooLargeError,
    ModelUnavailableError,
    ServiceError,
)
from service.models.served import ServedModel
from service.observe.metrics import Metrics
from service.pipelines.base import ModelPipeline
from service.settings import Settings

from .loading import Loader
from .memory import resident_bytes, trim_now
from .memory_budget import MemoryBudget
from .polling import RepositoryPoller
from .registry import PREFERRED_DEFAULTS, ModelLookup, ModelRegistry, NoOffer
from .states import ModelState

log = logging.getLogger(__name__)


class ModelObserver(Protocol):
    """What the host reports of the models it serves (``service.observe.metrics.Metrics``)."""

    def served(self, model: str, version: str, task: str, provider: str, variant: ServedVariant) -> None: ...

    def retired(self, model: str, version: str) -> None: ...

    def loaded(self, model: str, result: str, seconds: float) -> None: ...

    def resident(self, model: str, version: str, size: int | None) -> None: ...

    def evicted(self, model: str) -> None: ...


class RepositoryOffer:
    """The repository on disk, read when asked: its folders, and with a memory budget, what would load."""

    def __init__(self, loader: Loader, memory: MemoryBudget) -> None:
        self.loader = loader
        self.memory = memory

    def folders(self) -> Collection[str]:
        return self.loader.folders()

    def on_demand(self, name: str) -> bool:
        return self.memory.enabled and self.loader.servable(name)

    def default_for(self, task: str) -> str | None:
        if not self.memory.enabled:
            return None
        return self.loader.default_for(task, PREFERRED_DEFAULTS.get(task))



class ModelHost:
    """The models of this process: ``registry`` says which pipeline answers; the host changes it."""

    def __init__(
        self,
        registry: ModelRegistry,
        loader: Loader | None = None,
        observer: ModelObserver | None = None,
        retire_timeout_s: float = 30.0,
        memory_budget: int = 0,
        load_timeout_s: float = 30.0,
        min_residency_s: float = 0.0,
        poller: Callable[[ModelHost], RepositoryPoller] | None = None,
    ) -> None:
        self.registry = registry
        self.loader = loader  # None: the models are those of start-up (no load, no unload)
        self.observer = observer
        self.retire_timeout_s = retire_timeout_s  # how long a retired version may take to finish its work
        self.memory = MemoryBudget(memory_budget)
        # which model a request is for, and whether it is one of ours: the rules a front end's mirror shares
        self.lookup = ModelLookup(registry, RepositoryOffer(loader, self.memory) if loader else NoOffer())
        self.load_timeout_s = load_timeout_s  # how long a request waits for its model to load (on demand)
        # With a budget: a model loaded on demand is not unloaded for another before it has served this long
        # (MODEL_MIN_RESIDENCY_S), so clients alternating between models cannot make the service thrash.
        self.min_residency_s = min_residency_s
        # Called after every change of what serves (the engine process tells its front ends).
        self.on_change: Callable[[], None] | None = None
        self._poller = poller(self) if poller is not None else None
        self._on_demand: dict[str, asyncio.Task[ServedModel]] = {}
        self._loaded_at: dict[str, float] = {}
        # Models that requests waiting for them have just had loaded: none is unloaded before those requests
        # have taken their lease (``resident``).
        self._pinned: Counter[str] = Counter()
        self._started: list[ModelPipeline] = []
        self._warmup = True
        self._loading: dict[str, asyncio.Lock] = {}
        self._retiring: dict[ModelPipeline, asyncio.Task[None]] = {}

    @classmethod
    async def open(cls, settings: Settings, metrics: Metrics | None = None) -> ModelHost:
        """The host ``settings`` describe: the repository's models read (not yet started), or, with a memory
        budget, none yet (``start`` loads them one at a time, measured); a loader when models may change
        while serving; the poller with MODEL_CONTROL_MODE=poll."""
        loader = Loader(settings, metrics)
        budgeted = settings.model_memory_budget > 0
        registry = await loader.startup([] if budgeted else settings.served_models or None)
        controlled = settings.model_control_mode != "none"
        polled = settings.model_control_mode == "poll"
        return cls(
            registry,
            loader=loader if controlled or budgeted else None,
            observer=metrics,
            retire_timeout_s=settings.shutdown_timeout_s,
            memory_budget=settings.model_memory_budget,
            load_timeout_s=settings.queue_timeout_s,
            min_residency_s=settings.model_min_residency_s,
            poller=(
                (
                    lambda host: RepositoryPoller(
                        host, loader, settings.model_repository_poll_s, settings.served_models or None
                    )
                )
                if polled
                else None
            ),
        )

    @property
    def up(self) -> bool:
        """The models run in this process: up while it is."""
        return True

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self, warmup: bool) -> None:
        """Start every pipeline, warm each up; with a budget, load the repository's models while they fit;
        then start polling the repository (MODEL_CONTROL_MODE=poll).

        A model whose warm-up fails is stopped and refused (one log line), like a broken folder: the other
        models serve.
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
        if self.memory.enabled and self.loader is not None:
            await self.preload([n for n in self.loader.folders() if self.loader.servable(n)])
        if self._poller is not None:
            self._poller.start()
        self._changed()

    async def stop(self, timeout_s: float) -> None:
        """Stop polling, then let each model finish its work within ``timeout_s``; reverse start order."""
        if self._poller is not None:
            await self._poller.stop()
        for task in list(self._retiring.values()):
            task.cancel()
        for pipeline in reversed(self._started):
            try:
                await pipeline.stop(timeout_s)
            except Exception:  # one engine failing to stop must not keep the others running
                log.exception("stopping %s failed", pipeline.name)
        self._started.clear()

    # --- the repository while serving: load (or reload), unload --------------------------------------

    async def load(
        self, name: str, changed_only: bool = False, make_room: bool = True, wait_s: float = 0.0
    ) -> ServedModel:
        """Load model ``name`` from its folder, or reload it when it serves: each version its policy serves
        is built and warmed up beside the serving ones, then they take every new request at once; each
        request that had resolved a replaced version finishes on it, and its sessions are freed when the
        last one ends. ``changed_only`` (poll mode) keeps the serving versions whose files are unchanged;
        ``make_room`` (with a memory budget) unloads idle models, least recently used first, so that it fits;
        ``wait_s`` > 0 (a load on demand) waits that long at most for a model to become idle and old enough
        to go (``MODEL_MIN_RESIDENCY_S``). A model whose served files alone pass the budget is refused at once
        (``ModelTooLargeError``), nothing unloaded. A load that fails raises ``ModelLoadFailedError`` and
        leaves the serving versions as they were."""
        loader = self._control()
        lock = self._loading.setdefault(name, asyncio.Lock())
        try:
            async with lock, self.memory.measuring():  # one load of a name at a time; with a budget, of any
                return await self._load(loader, name, changed_only, make_room, wait_s)
        finally:
            self._changed()

    async def _load(
        self, loader: Loader, name: str, changed_only: bool, make_room: bool, wait_s: float
    ) -> ServedModel:
        began = time.perf_counter()
        serving = self.registry.versions.get(name, [])
        if make_room:
            expected = self.memory.expected(name, loader.served_bytes(name))
            self._fits_at_all(name, expected)
            await self._make_room(name, expected, wait_s)
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
            self._loaded_at[name] = time.monotonic()
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
        self._changed()

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
            reason = (
                "not resident: loads on its first request (MODEL_MEMORY_BUDGET)"
                if self.loads_on_demand(name)
                else "unloaded"
            )
            states.setdefault(name, ModelState(name, None, "UNAVAILABLE", reason))
        for name, lock in self._loading.items():
            if lock.locked():
                served = states.get(name)
                states[name] = ModelState(name, served.version if served else None, "LOADING")
        return [states[name] for name in sorted(states)]

    def knows(self, name: str) -> bool:
        return self.lookup.knows(name)

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

    async def retired(self) -> None:
        """Until every replaced or unloaded version has stopped and freed its sessions (for tests, drains)."""
        while self._retiring:
            await asyncio.gather(*self._retiring.values(), return_exceptions=True)

    # --- more models than memory (MODEL_MEMORY_BUDGET) -----------------------------------------------

    def target(self, model: str | None, task: str | None) -> str | None:
        return self.lookup.target(model, task)

    def loads_on_demand(self, name: str) -> bool:
        return self.lookup.loads_on_demand(name)

    async def resident(self, model: str | None, task: str | None = None) -> None:
        """With a memory budget: load model ``model`` (``name[@version]``; None: ``task``'s default) if it is
        in the repository but not resident, the request waiting at most ``load_timeout_s`` (then 503 with
        Retry-After); mark it used. Without a budget, or for a resident model, nothing but that mark.

        A caller that resolves the model right after this returns (no ``await`` between) finds it: while a
        request waits for its load, the model is pinned, and nothing unloads it to make room for another
        before the request has resumed and taken its lease (``pipeline.leased()``). The caller checks the
        key's access first (``InferenceService.resident``): a key may not load, and so unload others for, a
        model it may not use."""
        name = self.target(model, task)
        if name is None:
            return
        if name in self.registry.versions:
            self.memory.touch(name)
            return
        if not self.loads_on_demand(name):
            return  # the lookup that follows answers 404
        self._pinned[name] += 1
        try:
            loading = self._on_demand.get(name)
            if loading is None or loading.done():
                loading = self._on_demand[name] = asyncio.ensure_future(
                    self.load(name, changed_only=True, wait_s=self.load_timeout_s)
                )
            try:
                await asyncio.wait_for(asyncio.shield(loading), self.load_timeout_s)
            except TimeoutError as exc:
                raise ModelUnavailableError(
                    f"model {name!r} is loading (it was not resident) and took longer than QUEUE_TIMEOUT_S"
                ) from exc
            except ModelLoadFailedError as exc:
                raise ModelUnavailableError(f"model {name!r} could not be loaded: {exc.reason}") from exc
        finally:
            self._pinned[name] -= 1
            if not self._pinned[name]:
                del self._pinned[name]

    def _fits_at_all(self, name: str, expected: int) -> None:
        """Refuse at once a model that could not fit the budget even alone: unloading others would not help."""
        if self.memory.enabled and expected > self.memory.budget:
            raise ModelTooLargeError(
                f"model {name!r} needs about {expected / 2**20:.1f} MiB, more than MODEL_MEMORY_BUDGET "
                f"({self.memory.budget / 2**20:.1f} MiB) holds: it cannot be loaded here"
            )

    async def preload(self, names: list[str]) -> None:
        """At start-up with a memory budget: load the models in turn while each fits; the others load on
        their first request."""
        assert self.loader is not None, "a budget loads models itself"
        for name in names:
            expected = self.memory.expected(name, self.loader.served_bytes(name))
            if expected > self.memory.budget:
                log.error("%s is not served: its graphs alone need more than MODEL_MEMORY_BUDGET", name)
                continue
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

    async def _make_room(self, name: str, needed: int, wait_s: float = 0.0) -> None:
        """Unload idle models, least recently used first, until ``needed`` more bytes fit the budget.

        A model goes only when no request holds it, no stream of it runs, no request waits to use it after
        its load, and, when ``wait_s`` > 0 (a load on demand), it has been resident MODEL_MIN_RESIDENCY_S.
        With ``wait_s``, the load waits that long at most for such a model; then, or at once without it,
        503 with Retry-After."""
        if not self.memory.enabled:
            return
        give_up = time.monotonic() + wait_s
        while self.memory.used() + needed > self.memory.budget:
            now = time.monotonic()
            others = [n for n in self.registry.versions if n != name and n not in self._on_demand_loading()]
            idle = [
                n
                for n in others
                if not any(p.busy for p in self.registry.versions[n]) and not self._pinned.get(n)
            ]
            young = {n: self._residency_left(n, now) for n in idle} if wait_s > 0 else {}
            ready = [n for n in idle if young.get(n, 0.0) <= 0]
            if not ready:
                if not needed or self.memory.used() + needed <= self.memory.budget:
                    return
                if now < give_up and others:
                    await self._room_changes(others, min([*young.values(), give_up - now, 0.25]))
                    continue
                retry = max(young.values(), default=1.0)
                raise ModelUnavailableError(
                    f"model {name!r} does not fit MODEL_MEMORY_BUDGET beside the models at work",
                    retry_after_s=max(1, int(retry + 0.999)),
                )
            victim = min(ready, key=self.memory.last_used)
            log.info("%s: unloaded to make room for %s (MODEL_MEMORY_BUDGET)", victim, name)
            evicted = self.registry.remove(victim)
            self._loaded_at.pop(victim, None)
            for pipeline in evicted:
                self._retire(pipeline)
                self.memory.forget(pipeline)  # counted out now
            # idle, so retired at once: its memory is freed (and handed back) before the next is measured
            await asyncio.gather(*(self._retiring[p] for p in evicted if p in self._retiring))
            trim_now()
            if self.observer is not None:
                self.observer.evicted(victim)
            self._changed()

    def _residency_left(self, name: str, now: float) -> float:
        """Seconds before model ``name`` has been resident MODEL_MIN_RESIDENCY_S (0: it may go)."""
        loaded = self._loaded_at.get(name)
        return 0.0 if loaded is None else max(0.0, loaded + self.min_residency_s - now)

    async def _room_changes(self, names: list[str], timeout_s: float) -> None:
        """Until one of the models ``names`` falls idle, or ``timeout_s`` (a model's residency ending). A
        model busy with streams only (no request holds it) is looked at again every 50 ms."""
        pipelines = [p for n in names for p in self.registry.versions.get(n, []) if p.busy]
        waits = [asyncio.ensure_future(p.idle()) for p in pipelines if p.held]
        if len(waits) < len(pipelines):
            timeout_s = min(timeout_s, 0.05)
        try:
            if waits:
                await asyncio.wait(waits, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(max(0.0, timeout_s))
        finally:
            for wait in waits:
                wait.cancel()

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

    # --- what the host reports -----------------------------------------------------------------------

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _served(self, pipeline: ModelPipeline) -> None:
        if self.observer is not None:
            m = pipeline.model
            self.observer.served(m.name, m.version, m.task, m.provider, m.variant)

    def _observe_load(self, name: str, result: str, began: float) -> None:
        if self.observer is not None:
            self.observer.loaded(name, result, time.perf_counter() - began)
