"""Every door's Litestar controllers, one per resource: each only maps its protocol to the inference core.

``RAW_ERROR_SHAPES``: each door's error body for its own paths, for the answers a middleware sends
before any handler runs (``api/http/raw_errors.py``); every other path answers in the REST shape.
"""

from litestar import Router
from litestar.types import ControllerRouterHandler

from service.api.libretranslate.errors import (
    is_body_keyed_path,
    is_libretranslate_path,
    libretranslate_error_body,
)
from service.api.libretranslate.routes import LibreTranslateController
from service.api.openai.chat import ChatController
from service.api.openai.completions import CompletionsController
from service.api.openai.embeddings import EmbeddingsController
from service.api.openai.errors import OPENAI_EXCEPTION_HANDLERS, is_openai_path, openai_error_body
from service.api.openai.rerank import RerankController, ScoreController
from service.api.pages.playground import PlaygroundController
from service.api.rest.classify import ClassifyController
from service.api.rest.embed import EmbedController
from service.api.rest.extract import ExtractController
from service.api.rest.generate import GenerateController
from service.api.rest.system import HealthController, MetricsController, ModelsController
from service.api.rest.translate import TranslateController
from service.api.tei.errors import is_tei_path, tei_error_body
from service.api.tei.rerank import TeiRerankController
from service.api.tei.routes import TeiController
from service.api.tei.tasks import TaskController
from service.api.tei.tokens import TokenController
from service.api.v2.errors import is_v2_path, v2_error_body
from service.api.v2.generate import GenerateExtensionController
from service.api.v2.repository import RepositoryController
from service.api.v2.routes import OpenInferenceController

CONTROLLERS: list[ControllerRouterHandler] = [
    TranslateController,
    ClassifyController,
    GenerateController,
    CompletionsController,
    ChatController,
    EmbedController,
    EmbeddingsController,
    RerankController,
    ScoreController,
    TeiRerankController,
    TeiController,
    TaskController,
    TokenController,
    ExtractController,
    # OpenAI's model list (with this service's own fields): OpenAI's error shape
    Router("/", route_handlers=[ModelsController], exception_handlers=OPENAI_EXCEPTION_HANDLERS),
    HealthController,
    MetricsController,
    OpenInferenceController,
    RepositoryController,
    GenerateExtensionController,
    PlaygroundController,
    LibreTranslateController,
]

RAW_ERROR_SHAPES = (
    (is_openai_path, openai_error_body),
    (is_v2_path, v2_error_body),
    (is_tei_path, tei_error_body),
    (is_libretranslate_path, libretranslate_error_body),
)
# The paths whose clients send their API key in the body (LibreTranslate's ``api_key``): api/http/body_key.py
BODY_KEYED = is_body_keyed_path

__all__ = ["BODY_KEYED", "CONTROLLERS", "RAW_ERROR_SHAPES", "HealthController", "MetricsController"]
