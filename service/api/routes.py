"""Every door's Litestar controllers, one per resource: each only maps its protocol to the inference core."""

from service.api.openai.completions import CompletionsController
from service.api.openai.embeddings import EmbeddingsController
from service.api.pages.playground import PlaygroundController
from service.api.rest.classify import ClassifyController
from service.api.rest.embed import EmbedController
from service.api.rest.extract import ExtractController
from service.api.rest.generate import GenerateController
from service.api.rest.system import HealthController, MetricsController, ModelsController
from service.api.rest.translate import TranslateController
from service.api.v2.generate import GenerateExtensionController
from service.api.v2.routes import OpenInferenceController

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
    GenerateExtensionController,
    PlaygroundController,
]

__all__ = ["CONTROLLERS", "HealthController", "MetricsController"]
