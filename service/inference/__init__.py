"""Between HTTP and the engine: per-task pipelines, admission and await, model resolution (TEI's ``infer``)."""

from .errors import (
    InvalidInputError,
    ModelNotFoundError,
    NoModelForTaskError,
    NotReadyError,
    ServiceError,
    TaskMismatchError,
)
from .generate import GenerateParams
from .service import InferenceService
from .translate import DecodingParams

__all__ = [
    "DecodingParams",
    "GenerateParams",
    "InferenceService",
    "InvalidInputError",
    "ModelNotFoundError",
    "NoModelForTaskError",
    "NotReadyError",
    "ServiceError",
    "TaskMismatchError",
]
