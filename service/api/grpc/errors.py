"""Errors on the gRPC door: each error the core (or the v2 decoding) raises, as a gRPC status code.

The same classes as HTTP's one table (``api/http/errors.py``), in gRPC's words: a bad tensor or
parameter is ``INVALID_ARGUMENT`` naming it (what Triton answers), an unknown model ``NOT_FOUND``, a
full queue ``RESOURCE_EXHAUSTED``, a service starting, draining or stopping ``UNAVAILABLE``; anything
else is ``INTERNAL`` and logged.
"""

from __future__ import annotations

import logging

import grpc

from service.api.http.errors import MalformedBodyError
from service.errors import (
    InvalidInputError,
    ModelNotFoundError,
    NoModelForTaskError,
    NotReadyError,
    ServiceError,
)
from service.inference import BatcherClosedError, EngineError, QueueFullError, QueueTimeoutError

log = logging.getLogger(__name__)

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedBodyError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (NoModelForTaskError, grpc.StatusCode.NOT_FOUND),
    (NotReadyError, grpc.StatusCode.UNAVAILABLE),
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueTimeoutError, grpc.StatusCode.UNAVAILABLE),
    (BatcherClosedError, grpc.StatusCode.UNAVAILABLE),
]


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for ``exc`` (field first, as on HTTP: ``text[0]: must not be empty``)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            if isinstance(exc, ServiceError):
                message = f"{exc.field}: {exc.message}" if exc.field else exc.message
            else:
                message = str(exc)
            return code, message
    if isinstance(exc, EngineError):
        log.error("inference failed: %s", exc)
        return grpc.StatusCode.INTERNAL, "inference failed; see the service log"
    log.error("unhandled error on gRPC", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error; see the service log"
