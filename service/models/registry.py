"""Which pipeline answers a request: by name, or the task's default model; what was refused and why."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar

from service.context import note_model
from service.engine.repository import without_paths
from service.errors import (
    ModelNotFoundError,
    ModelVersionNotFoundError,
    NoModelForTaskError,
    TaskMismatchError,
)
from service.metadata import ANONYMOUS, RequestMeta
from service.pipelines.base import ModelPipeline
from service.pipelines.factory import PIPELINES

P = TypeVar("P", bound=ModelPipeline)

# The model a request without `model` gets, per task (each pipeline declares it); when that one is not
# loaded, the first loaded model (by name) with the task serves as the default.
PREFERRED_DEFAULTS = {task: pipeline.default_model for task, pipeline in PIPELINES.items()}


def newest_first(pipelines: Iterable[ModelPipeline]) -> list[ModelPipeline]:
    """A model's versions, the highest version folder first (a flat folder is its only version)."""
    return sorted(pipelines, key=lambda p: int(p.model.label or 0), reverse=True)


class ModelRegistry:
    """The served models by name, each with its served versions (``engine/versions.py``): a request that
    names no version gets the newest; ``name@version`` (a version folder's number, or the content hash
    that answers carry as ``model_version``) picks one."""

    def __init__(self, pipelines: Iterable[ModelPipeline], refused: dict[str, str]) -> None:
        grouped: dict[str, list[ModelPipeline]] = {}
        for pipeline in pipelines:
            grouped.setdefault(pipeline.name, []).append(pipeline)
        self.versions: dict[str, list[ModelPipeline]] = {
            name: newest_first(versions) for name, versions in sorted(grouped.items())
        }
        # as callers see them (readiness is open by default): no host paths; the log has them whole
        self.refused = {name: without_paths(reason) for name, reason in refused.items()}
        self.defaults: dict[str, str] = {}
        self._choose_defaults()

    @property
    def pipelines(self) -> dict[str, ModelPipeline]:
        """Each served model's newest version, by name: what a request without a version gets."""
        return {name: versions[0] for name, versions in self.versions.items()}

    def all_versions(self) -> list[ModelPipeline]:
        return [p for versions in self.versions.values() for p in versions]

    def _choose_defaults(self) -> None:
        """Each task's preferred model when loaded, else the first loaded model (by name) of the task."""
        self.defaults = {}
        for pipeline in self.pipelines.values():
            self.defaults.setdefault(pipeline.task, pipeline.name)
        for task, name in PREFERRED_DEFAULTS.items():
            if name in self.versions and self.versions[name][0].task == task:
                self.defaults[task] = name

    def refuse(self, name: str, reason: str) -> None:
        """Take a loaded model out of service (e.g. its warm-up failed)."""
        self.versions.pop(name, None)
        self.refused[name] = without_paths(reason)
        self._choose_defaults()

    def swap(self, name: str, versions: list[ModelPipeline]) -> list[ModelPipeline]:
        """Serve ``versions`` as model ``name`` from now on; the pipelines they replace (still running:
        requests that resolved them finish on them)."""
        old = self.versions.get(name, [])
        self.versions = dict(sorted({**self.versions, name: newest_first(versions)}.items()))
        self.refused.pop(name, None)
        self._choose_defaults()
        return [p for p in old if all(p is not q for q in versions)]

    def remove(self, name: str) -> list[ModelPipeline]:
        """Stop serving ``name``; its pipelines (still running for the requests that resolved them)."""
        self.get(name)
        old = self.versions.pop(name)
        self._choose_defaults()
        return old

    def default_for(self, name: str) -> list[str]:
        return sorted(task for task, n in self.defaults.items() if n == name)

    def get(self, name: str, version: str | None = None, meta: RequestMeta = ANONYMOUS) -> ModelPipeline:
        """The loaded model ``name`` (or ``name@version``), whatever its task: its newest version, or the
        one whose folder number or content hash is ``version``; to ``meta``'s caller, only a model its key
        may use (the engine process's own lookups: any)."""
        if version is None and "@" in name:
            name, version = name.split("@", 1)
        versions = self.versions.get(name)
        if versions is None or not meta.may_see(name):  # a model the caller's key may not use: as if unknown
            raise ModelNotFoundError(name, meta.visible(self.versions))
        # Request metrics and logs carry the model, also when the request fails later. Only loaded
        # names: a client's arbitrary string must not become a metric label.
        note_model(name)
        if version is None:
            return versions[0]
        for pipeline in versions:
            if version in (pipeline.model.label, pipeline.model.version):
                return pipeline
        served = ", ".join(p.model.label or p.model.version for p in versions)
        raise ModelVersionNotFoundError(name, version, served)

    def resolve_task(self, task: str, name: str | None, meta: RequestMeta = ANONYMOUS) -> ModelPipeline:
        """The model named ``name`` (default: ``task``'s default model), which must serve ``task``."""
        if name is None:
            if task not in self.defaults or not meta.may_see(self.defaults[task]):
                raise NoModelForTaskError(task)
            name = self.defaults[task]
        pipeline = self.get(name, meta=meta)
        if pipeline.task != task:
            raise TaskMismatchError(pipeline.name, pipeline.task, task)
        return pipeline

    def resolve(self, kind: type[P], name: str | None, meta: RequestMeta = ANONYMOUS) -> P:
        """The pipeline of type ``kind`` named ``name`` (default: the task's default model)."""
        pipeline = self.resolve_task(kind.task, name, meta)
        if not isinstance(pipeline, kind):
            raise TaskMismatchError(pipeline.name, pipeline.task, kind.task)
        return pipeline


# --- which model a request is for (both hosts) ---------------------------------------------------------
#
# Which model a request is for, and whether the service knows it: written once, for both kinds of host.
#
# A request names a model (``name[@version]``) or only its task. ``ModelLookup`` answers, over the registry
# (what serves) and an ``Offer`` (what the repository holds besides):
#
# - ``target``: the model the request is for: the one it names, else its task's default that serves, else,
#   with a memory budget, the folder that would load for the task;
# - ``knows``: whether a name is a model of this service at all (resident, refused, or a folder of the
#   repository), which is 404 against 503;
# - ``loads_on_demand``: whether a request for it would load it (a memory budget, and a folder it may serve).
#
# The engine's ``ModelHost`` reads its ``Offer`` live from the repository (``host.RepositoryOffer``); a
# front end's ``RemoteHost`` reads the one the engine last broadcast (``ipc/remote_host.py``), which the
# engine built with this same lookup. So the rules live here, and each host only says where its facts come from.


class Offer(Protocol):
    """What the repository holds beyond what serves."""

    def folders(self) -> Collection[str]:
        """The repository's model folders."""

    def on_demand(self, name: str) -> bool:
        """Whether a request for ``name`` would load it."""

    def default_for(self, task: str) -> str | None:
        """The folder that would load for a request of ``task`` that names no model (None: none would)."""


class NoOffer:
    """The models of start-up, fixed (MODEL_CONTROL_MODE=none, no budget): the repository offers nothing."""

    def folders(self) -> Collection[str]:
        return ()

    def on_demand(self, name: str) -> bool:
        return False

    def default_for(self, task: str) -> str | None:
        return None


class ModelLookup:
    def __init__(self, registry: ModelRegistry, offer: Offer) -> None:
        self.registry = registry
        self.offer = offer

    def target(self, model: str | None, task: str | None) -> str | None:
        """The model name a request for ``model`` (``name[@version]``; None: ``task``'s default) is for: the
        default that serves, else, with a budget, the folder that would load for the task (None: none)."""
        if model is not None:
            return model.split("@", 1)[0]
        if task is None:
            return None
        if task in self.registry.defaults:
            return self.registry.defaults[task]
        return self.offer.default_for(task)

    def loads_on_demand(self, name: str) -> bool:
        """Whether a request for ``name`` would load it (a memory budget, and a folder it may serve)."""
        return self.offer.on_demand(name)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a model of this service: resident, refused, or a folder of the repository."""
        return name in self.registry.versions or name in self.registry.refused or name in self.offer.folders()
