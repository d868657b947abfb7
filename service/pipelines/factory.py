"""One pipeline per loaded model, configured from the settings."""

from __future__ import annotations

from service.engine.batcher import BatchPolicy
from service.engine.continuous_batching import GenerationEngine
from service.engine.repository import LoadedModel
from service.metrics import Metrics
from service.settings import Settings

from .base import ModelPipeline
from .classify import ImageClassifier, TextClassifier
from .embed import SentenceEmbedder
from .extract import EntityTagger, QuestionAnswerer
from .generate import Generator
from .translate import Translator


def batch_policy(settings: Settings) -> BatchPolicy:
    return BatchPolicy(
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        max_queue_delay_ms=settings.max_queue_delay_ms,
        max_queue_size=settings.max_queue_size,
        queue_timeout_s=settings.queue_timeout_s,
        split_ratio=settings.batch_split_ratio,
        split_min_tokens=settings.batch_split_min_tokens,
    )


def build_pipeline(model: LoadedModel, settings: Settings, metrics: Metrics | None = None) -> ModelPipeline:
    """The pipeline for the model's task (the repository loader has already refused unknown tasks)."""
    policy = batch_policy(settings)
    task = model.task
    observer = metrics.batcher_observer(model.name) if metrics is not None else None
    if task == "text-classification":
        return TextClassifier(model, policy, observer)
    if task == "image-classification":
        return ImageClassifier(
            model, policy, settings.max_image_pixels, observer, max_request_pixels=settings.max_request_pixels
        )
    if task == "translation":
        return Translator(model, policy, settings.max_new_tokens, observer)
    if task == "question-answering":
        return QuestionAnswerer(model, policy, observer, max_context_tokens=settings.max_context_tokens)
    if task == "token-classification":
        return EntityTagger(model, policy, observer)
    if task == "feature-extraction":
        return SentenceEmbedder(model, policy, observer)
    if task == "text-generation":
        engine = GenerationEngine(
            model,
            max_running=settings.max_running_sequences,
            max_queue_size=settings.max_queue_size,
            queue_timeout_s=settings.queue_timeout_s,
            observer=metrics.generation_observer(model.name) if metrics is not None else None,
        )
        return Generator(model, engine)
    raise ValueError(f"no pipeline serves task {task!r}")
