"""Which pipeline answers a request: by name, or the task's default model; what was refused and why."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from service.context import note_model
from service.errors import ModelNotFoundError, NoModelForTaskError, TaskMismatchError
from service.pipelines.base import ModelPipeline

P = TypeVar("P", bound=ModelPipeline)

# The model a request without `model` gets, per task; when that one is not loaded,
# the first loaded model (by name) with the task serves as the default.
PREFERRED_DEFAULTS = {
    "translation": "translator",
    "text-classification": "bert-classifier",
    "image-classification": "vit",
    "text-generation": "gpt",
    "question-answering": "bert-qa",
    "token-classification": "bert-tagger",
    "feature-extraction": "bert-embedder",
}


class ModelRegistry:
    def __init__(self, pipelines: Iterable[ModelPipeline], refused: dict[str, str]) -> None:
        self.pipelines: dict[str, ModelPipeline] = {
            p.name: p for p in sorted(pipelines, key=lambda p: p.name)
        }
        self.refused = dict(refused)
        self.defaults: dict[str, str] = {}
        for pipeline in self.pipelines.values():
            self.defaults.setdefault(pipeline.task, pipeline.name)
        for task, name in PREFERRED_DEFAULTS.items():
            if name in self.pipelines and self.pipelines[name].task == task:
                self.defaults[task] = name

    def refuse(self, name: str, reason: str) -> None:
        """Take a loaded model out of service (e.g. its warm-up failed)."""
        self.pipelines.pop(name, None)
        self.refused[name] = reason
        self.defaults = {task: n for task, n in self.defaults.items() if n != name}
        for pipeline in self.pipelines.values():
            self.defaults.setdefault(pipeline.task, pipeline.name)

    def default_for(self, name: str) -> list[str]:
        return sorted(task for task, n in self.defaults.items() if n == name)

    def resolve(self, kind: type[P], name: str | None, input_field: str) -> P:
        """The pipeline of type ``kind`` named ``name`` (default: the task's default model).

        ``input_field`` names the request field whose kind of input needs this
        task, for the message when the named model serves another task.
        """
        task = kind.task
        if name is None:
            if task not in self.defaults:
                raise NoModelForTaskError(task)
            name = self.defaults[task]
        pipeline = self.pipelines.get(name)
        if pipeline is None:
            raise ModelNotFoundError(name, list(self.pipelines))
        # Request metrics and logs carry the model, also when the request fails later. Only loaded
        # names: a client's arbitrary string must not become a metric label.
        note_model(name)
        if not isinstance(pipeline, kind):
            raise TaskMismatchError(
                f"model {name!r} serves {pipeline.task}; field {input_field!r} needs a {task} model"
            )
        return pipeline
