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
from service.engine.structured_output import StructuredOutput
from service.pipelines.attention import AttentionQuery
from service.pipelines.contract import Parameter, TaskContract, TensorSpec
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
    Translation,
    TranslationSequence,
    Usage,
)
from service.pipelines.translate import DecodingParams

from .limits import CONTEXTS, INPUTS, MAX_NEW_TOKENS, RequestLimits, image_bytes
from .models import ServedModel
from .service import DEFAULT_MAX_NEW_TOKENS, InferenceService, ModelState
from .streams import ChoiceDone, GenerationStreams, TokenOut

__all__ = [
    "BYPASS",
    "CONTEXTS",
    "DEFAULT_MAX_NEW_TOKENS",
    "INPUTS",
    "MAX_NEW_TOKENS",
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
    "ServedModel",
    "StructuredOutput",
    "TaskContract",
    "TensorSpec",
    "TokenEvent",
    "TokenLogprob",
    "TokenOut",
    "Translation",
    "TranslationSequence",
    "Usage",
    "image_bytes",
]
