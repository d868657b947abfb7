"""Litestar controllers, one per resource; they only translate between JSON and the inference layer."""

from .classify import ClassifyController
from .embed import EmbedController, EmbeddingsController
from .extract import ExtractController
from .generate import GenerateController
from .openai import CompletionsController
from .playground import PlaygroundController
from .system import HealthController, MetricsController, ModelsController
from .translate import TranslateController
from .v2 import OpenInferenceController

CONTROLLERS = [
    TranslateController,
    ClassifyController,
    GenerateController,
    CompletionsController,
    EmbedController,
    EmbeddingsController,
    ExtractController,
    ModelsController,
    HealthController,
    MetricsController,
    OpenInferenceController,
    PlaygroundController,
]

__all__ = ["CONTROLLERS", "HealthController", "MetricsController"]
