"""The inference core: the one way in for every protocol door, and every type a door needs.

``InferenceService`` takes task requests in these types, applies the request
limits and defaults once, resolves models and runs the pipelines behind the
response cache. The doors (``service.api.*``) import from here only: never
from ``service.engine`` or ``service.pipelines``, and never the registry.
"""

from service.cache.response_cache import BYPASS, USE_CACHE, CacheControl
from service.engine.errors import (
    BatcherClosedError,
    EngineError,
    QueueFullError,
    QueueTimeoutError,
)
from service.engine.generation_contract import GenerationCancelledError, TokenEvent
from service.engine.manifest import Manifest
from service.engine.sampling import SamplingParams, TokenLogprob
from service.engine.structured_output import MAX_CHOICES, StructuredOutput
from service.models.served import ServedModel
from service.pipelines.attention import AttentionQuery
from service.pipelines.contract import Parameter, TaskContract, TensorSpec
from service.pipelines.documents import TextFormat
from service.pipelines.results import (
    Answer,
    AttentionMap,
    Classification,
    Embedding,
    Entities,
    EntitySpan,
    Generation,
    LabelScore,
    Outcome,
    Score,
    Translation,
    TranslationScore,
    TranslationSequence,
    Usage,
)
from service.pipelines.text_inputs import CUT_RIGHT, Truncation
from service.pipelines.translate import DecodingParams

from .limits import CONTEXTS, DOCUMENTS, INPUTS, MAX_NEW_TOKENS, QUERIES, RequestLimits, image_bytes
from .service import DEFAULT_MAX_NEW_TOKENS, InferenceService, ModelState
from .streams import ChoiceDone, GenerationStreams, TokenOut

__all__ = [
    "BYPASS",
    "CONTEXTS",
    "CUT_RIGHT",
    "DEFAULT_MAX_NEW_TOKENS",
    "DOCUMENTS",
    "INPUTS",
    "MAX_CHOICES",
    "MAX_NEW_TOKENS",
    "QUERIES",
    "USE_CACHE",
    "Answer",
    "AttentionMap",
    "AttentionQuery",
    "BatcherClosedError",
    "CacheControl",
    "ChoiceDone",
    "Classification",
    "DecodingParams",
    "Embedding",
    "EngineError",
    "Entities",
    "EntitySpan",
    "Generation",
    "GenerationCancelledError",
    "GenerationStreams",
    "InferenceService",
    "LabelScore",
    "Manifest",
    "ModelState",
    "Outcome",
    "Parameter",
    "QueueFullError",
    "QueueTimeoutError",
    "RequestLimits",
    "SamplingParams",
    "Score",
    "ServedModel",
    "StructuredOutput",
    "TaskContract",
    "TensorSpec",
    "TextFormat",
    "TokenEvent",
    "TokenLogprob",
    "TokenOut",
    "Translation",
    "TranslationScore",
    "TranslationSequence",
    "Truncation",
    "Usage",
    "image_bytes",
]
