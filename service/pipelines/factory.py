"""One pipeline per loaded model: the one its task declares (each pipeline says its task, default model
and how it is built from the settings, ``base.ModelPipeline``)."""

from __future__ import annotations

from service.engine.repository import LoadedModel
from service.observe.metrics import Metrics
from service.settings import Settings

from .base import Building, ModelPipeline, Workers
from .classify import ImageClassifier, TextClassifier
from .embed import SentenceEmbedder
from .extract import EntityTagger, QuestionAnswerer
from .generate import Generator
from .local_workers import LOCAL
from .rerank import CrossEncoder
from .translate import Translator

# task -> its pipeline
PIPELINES: dict[str, type[ModelPipeline]] = {
    cls.task: cls
    for cls in (
        TextClassifier,
        ImageClassifier,
        Translator,
        QuestionAnswerer,
        EntityTagger,
        SentenceEmbedder,
        CrossEncoder,
        Generator,
    )
}


def build_pipeline(
    model: LoadedModel, settings: Settings, metrics: Metrics | None = None, workers: Workers = LOCAL
) -> ModelPipeline:
    """The pipeline for the model's task (the repository loader has already refused unknown tasks), its model
    run by ``workers``: this process's, or for a front end's view, the engine process (``service/ipc/``)."""
    cls = PIPELINES.get(model.task)
    if cls is None:
        raise ValueError(f"no pipeline serves task {model.task!r}")
    return cls.build(model, Building(settings, metrics, workers))
