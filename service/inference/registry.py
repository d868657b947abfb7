"""Which pipeline answers a request: by name, or the task's default model; what was refused and why."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from service.context import note_model
from service.engine.repository import without_paths
from service.errors import ModelNotFoundError, NoModelForTaskError, TaskMismatchError
from service.pipelines.base import ModelPipeline
from service.pipelines.factory import PIPELINES

P = TypeVar("P", bound=ModelPipeline)

# The model a request without `model` gets, per task (each pipeline declares it); when that one is not
# loaded, the first loaded model (by name) with the task serves as the default.
PREFERRED_DEFAULTS = {task: pipeline.default_model for task, pipeline in PIPELINES.items()}


class ModelRegistry:
    def __init__(self, pipelines: Iterable[ModelPipeline], refused: dict[str, str]) -> None:
        self.pipelines: dict[str, ModelPipeline] = {
            p.name: p for p in sorted(pipelines, key=lambda p: p.name)
        }
        # as callers see them (readiness is open by default): no host paths; the log has them whole
        self.refused = {name: without_paths(reason) for name, reason in refused.items()}
        self.defaults: dict[str, str] = {}
        self._choose_defaults()

    def _choose_defaults(self) -> None:
        """Each task's preferred model when loaded, else the first loaded model (by name) of the task."""
        self.defaults = {}
        for pipeline in self.pipelines.values():
            self.defaults.setdefault(pipeline.task, pipeline.name)
        for task, name in PREFERRED_DEFAULTS.items():
            if name in self.pipelines and self.pipelines[name].task == task:
                self.defaults[task] = name

    def refuse(self, name: str, reason: str) -> None:
        """Take a loaded model out of service (e.g. its warm-up failed)."""
        self.pipelines.pop(name, None)
        self.refused[name] = without_paths(reason)
        self._choose_defaults()

    def swap(self, pipeline: ModelPipeline) -> ModelPipeline | None:
        """Serve ``pipeline`` under its name from now on; the pipeline it replaces, if any (still running:
        requests that resolved it finish on it)."""
        old = self.pipelines.get(pipeline.name)
        self.pipelines = dict(sorted({**self.pipelines, pipeline.name: pipeline}.items()))
        self.refused.pop(pipeline.name, None)
        self._choose_defaults()
        return old

    def remove(self, name: str) -> ModelPipeline:
        """Stop serving ``name``; its pipeline (still running for the requests that resolved it)."""
        pipeline = self.get(name)
        del self.pipelines[name]
        self._choose_defaults()
        return pipeline

    def default_for(self, name: str) -> list[str]:
        return sorted(task for task, n in self.defaults.items() if n == name)

    def get(self, name: str) -> ModelPipeline:
        """The loaded model ``name``, whatever its task."""
        pipeline = self.pipelines.get(name)
        if pipeline is None:
            raise ModelNotFoundError(name, list(self.pipelines))
        # Request metrics and logs carry the model, also when the request fails later. Only loaded
        # names: a client's arbitrary string must not become a metric label.
        note_model(name)
        return pipeline

    def resolve_task(self, task: str, name: str | None) -> ModelPipeline:
        """The model named ``name`` (default: ``task``'s default model), which must serve ``task``."""
        if name is None:
            if task not in self.defaults:
                raise NoModelForTaskError(task)
            name = self.defaults[task]
        pipeline = self.get(name)
        if pipeline.task != task:
            raise TaskMismatchError(name, pipeline.task, task)
        return pipeline

    def resolve(self, kind: type[P], name: str | None) -> P:
        """The pipeline of type ``kind`` named ``name`` (default: the task's default model)."""
        pipeline = self.resolve_task(kind.task, name)
        if not isinstance(pipeline, kind):
            raise TaskMismatchError(pipeline.name, pipeline.task, kind.task)
        return pipeline
