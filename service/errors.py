"""The service's error vocabulary: what went wrong, in kinds every door renders in its own shape.

Each error the core (or a door's decoding) raises on purpose has a **kind** (``validation_error``,
``model_not_found``, ``queue_full``, ...), a message, and the request field at fault, so a client can
fix the right thing. ``KINDS`` maps each kind once to its HTTP status and its gRPC status code;
``problem_of`` turns any exception into a ``Problem`` (kind, message, field, the field errors, when to
retry). A door only renders a ``Problem``: REST's ``{"error": {...}}``, OpenAI's, the Open Inference
Protocol's ``{"error": "..."}``, a gRPC status, an in-band stream event. Nothing else classifies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from service.engine.errors import (
    BatcherClosedError,
    DeadlineExceededError,
    EngineError,
    QueueFullError,
    QueueTimeoutError,
)
from service.engine.generation_contract import GenerationCancelledError

log = logging.getLogger(__name__)

# Retry-After when nothing better is known (service starting or stopping, a queue timeout).
DEFAULT_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ErrorKind:
    status: int  # HTTP
    grpc: str  # the gRPC status code's name
    when: str  # in words, for the API documents
    refunded: bool = False  # the service refused the request without doing its work: not counted in quotas


# Every kind of error the API answers with, once: its HTTP status, its gRPC code and when it is sent.
# The OpenAPI descriptions of each status and of the error bodies' ``type`` are made from this table.
KINDS: dict[str, ErrorKind] = {
    "malformed_json": ErrorKind(400, "INVALID_ARGUMENT", "the body is not JSON"),
    "bad_request": ErrorKind(400, "INVALID_ARGUMENT", "an unreadable request"),
    "unauthorized": ErrorKind(
        401, "UNAUTHENTICATED", "no valid API key: Authorization: Bearer KEY or X-API-Key: KEY"
    ),
    "model_not_found": ErrorKind(
        404, "NOT_FOUND", "no loaded model by that name, or none for the task (field `model`)"
    ),
    "not_found": ErrorKind(404, "NOT_FOUND", "no such path"),
    "method_not_allowed": ErrorKind(405, "UNIMPLEMENTED", "the path does not take this method"),
    "request_timeout": ErrorKind(
        408,
        "DEADLINE_EXCEEDED",
        "the body did not arrive within BODY_READ_TIMEOUT_S; the connection is closed",
    ),
    "forbidden": ErrorKind(
        403,
        "PERMISSION_DENIED",
        "the key may not make this call: a model outside its list (API_KEYS_FILE), or repository control "
        "without a key of ADMIN_API_KEYS (with none set, on a service on loopback only) or in a "
        "MODEL_CONTROL_MODE that refuses it",
    ),
    "control_off": ErrorKind(
        404,
        "UNIMPLEMENTED",
        "repository control is off (MODEL_CONTROL_MODE=none): the models of start-up serve until the end",
    ),
    "load_failed": ErrorKind(
        400,
        "FAILED_PRECONDITION",
        "the model folder could not be loaded (the message says why); a version already serving serves on",
    ),
    "payload_too_large": ErrorKind(413, "RESOURCE_EXHAUSTED", "body over MAX_BODY_BYTES"),
    "unsupported_media_type": ErrorKind(415, "INVALID_ARGUMENT", "wrong Content-Type (field `Content-Type`)"),
    "validation_error": ErrorKind(
        422,
        "INVALID_ARGUMENT",
        "a field is invalid: range, empty/whitespace/oversized text, too many items, undecodable image, "
        "model serving another task (with `field` and `errors`)",
    ),
    "quota_exceeded": ErrorKind(
        429,
        "RESOURCE_EXHAUSTED",
        "the API key has used its requests or tokens per minute (API_KEYS_FILE); see `Retry-After` and "
        "the `RateLimit-*` headers",
    ),
    "queue_full": ErrorKind(
        429,
        "RESOURCE_EXHAUSTED",
        "the model's queue is full; retry after the `Retry-After` header's seconds",
        refunded=True,
    ),
    "shed": ErrorKind(
        429,
        "RESOURCE_EXHAUSTED",
        "the service is busy (its event loop runs over SHED_LAG_MS late) and the request is low priority "
        "(`X-Request-Priority` or the key's default): refused at the edge; retry after `Retry-After`",
        refunded=True,
    ),
    "client_closed_request": ErrorKind(
        499, "CANCELLED", "the client went away; nobody reads it, but logs and metrics do"
    ),
    "cancelled": ErrorKind(499, "CANCELLED", "the generation was cancelled before it finished"),
    "deadline_exceeded": ErrorKind(
        504,
        "DEADLINE_EXCEEDED",
        "the request's own deadline (its timeout) passed while it waited; it was not computed",
        refunded=True,
    ),
    "internal_error": ErrorKind(
        500, "INTERNAL", "a bug in the service, logged with its traceback; never caused by request content"
    ),
    "not_ready": ErrorKind(
        503, "UNAVAILABLE", "the service is starting or draining; see `Retry-After`", refunded=True
    ),
    "queue_timeout": ErrorKind(
        503, "UNAVAILABLE", "the request waited too long in the queue; see `Retry-After`", refunded=True
    ),
    "unavailable": ErrorKind(
        503,
        "UNAVAILABLE",
        "the model is shutting down, or could not be loaded in time or into MODEL_MEMORY_BUDGET; see "
        "`Retry-After`",
        refunded=True,
    ),
    "model_too_large": ErrorKind(
        507,
        "RESOURCE_EXHAUSTED",
        "the files the model serves alone exceed MODEL_MEMORY_BUDGET: it cannot be loaded here, whatever "
        "else is unloaded (no `Retry-After`: retrying will not help)",
        refunded=True,
    ),
    "overloaded": ErrorKind(
        503, "UNAVAILABLE", "MAX_IN_FLIGHT_REQUESTS are being answered; see `Retry-After`", refunded=True
    ),
}


# The HTTP statuses of the refusals that did no work: a request answered with one is given back to its
# key's requests per minute (``quotas.Quotas.refund``). ``quota_exceeded`` shares 429 but is sent before
# the request is counted.
REFUNDED_STATUSES = frozenset(k.status for k in KINDS.values() if k.refunded)


def describe_status(status: int) -> str:
    """The kinds an HTTP status carries, for its OpenAPI description."""
    return "; ".join(f"`{kind}`: {k.when}" for kind, k in KINDS.items() if k.status == status)


def _rebuild(cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ServiceError(Exception):
    """Base of every error the service raises on purpose; ``kind`` says which (``KINDS``). Copyable and
    picklable whatever a subclass's ``__init__`` takes; between the split service's processes it crosses as
    a ``service/ipc/payloads.WireError``, its class and attributes kept."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, self.__dict__)

    kind: ClassVar[str] = "bad_request"

    def __init__(self, message: str, field: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.index = index  # the item of the request at fault (its position among the inputs), if one


class InvalidInputError(ServiceError):
    """An input the schema accepted but the service cannot take (over a limit, undecodable image...).

    ``reason`` is a short machine-readable word for clients (``too_long``, ``undecodable_image``...).
    """

    kind = "validation_error"

    def __init__(
        self, message: str, field: str | None = None, reason: str = "invalid_input", index: int | None = None
    ) -> None:
        super().__init__(message, field, index)
        self.reason = reason


class TaskMismatchError(InvalidInputError):
    """The named model serves another task than the input asks for (e.g. an image for a text classifier)."""

    def __init__(self, name: str, serves: str, needed: str) -> None:
        super().__init__(
            f"model {name!r} serves {serves}; this input needs a {needed} model", "model", "task_mismatch"
        )


class MalformedBodyError(ServiceError):
    """The body cannot be read as its Content-Type says: ``malformed_json`` or ``bad_request``."""

    def __init__(self, message: str, kind: str = "bad_request", field: str | None = None) -> None:
        super().__init__(message, field)
        self.kind = kind  # type: ignore[misc]  # this error's kind is the instance's


class UnsupportedMediaTypeError(ServiceError):
    """The request's Content-Type is not what the endpoint reads."""

    kind = "unsupported_media_type"

    def __init__(self, got: str, expected: str) -> None:
        super().__init__(
            f"Content-Type {got or '(none)'} is not supported here; send {expected}", "Content-Type"
        )


class ModelNotFoundError(ServiceError):
    """No loaded model has this name (it may have been refused at start-up: see GET /v1/models)."""

    kind = "model_not_found"

    def __init__(self, name: str, available: list[str]) -> None:
        listed = ", ".join(available) or "none"
        super().__init__(f"model {name!r} is not loaded (loaded: {listed})", field="model")
        self.name = name


class ModelVersionNotFoundError(ModelNotFoundError):
    """A version that is not the loaded one: 404, as Triton answers an unknown version."""

    def __init__(self, name: str, version: str, loaded: str) -> None:
        ServiceError.__init__(
            self,
            f"Request for unknown model: {name!r} version {version!r} is not found (loaded version: {loaded})",
            field="model_version",
        )
        self.name = name


class ForbiddenError(ServiceError):
    """A repository control call the caller may not make (its key, or the control mode, does not allow it)."""

    kind = "forbidden"


class ControlOffError(ServiceError):
    """A load or unload where MODEL_CONTROL_MODE=none: the call is not there, as before control existed."""

    kind = "control_off"


class ModelLoadFailedError(ServiceError):
    """A model folder that could not be loaded: the reason as ``engine/repository.py`` checks it."""

    kind = "load_failed"

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"failed to load {name!r}: {reason}", field="model_name")
        self.name = name
        self.reason = reason


class ModelFolderNotFoundError(ModelNotFoundError):
    """A load of a name that is no folder of the repository: 404 (a typo is not a failed load)."""

    def __init__(self, name: str) -> None:
        ServiceError.__init__(self, f"the model repository has no such folder: {name!r}", field="model_name")
        self.name = name


class NoModelForTaskError(ServiceError):
    """The request names no model and no loaded model serves its task."""

    kind = "model_not_found"

    def __init__(self, task: str) -> None:
        super().__init__(f"no loaded model serves {task}", field="model")
        self.task = task


class NotReadyError(ServiceError):
    """The service is starting or stopping; the client should retry after ``retry_after_s``."""

    kind = "not_ready"

    def __init__(self, state: str, retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(f"service is {state}, not ready for inference")
        self.state = state
        self.retry_after_s = retry_after_s


class ModelUnavailableError(ServiceError):
    """A model that exists but cannot answer now (it could not be loaded in time, or into memory)."""

    kind = "unavailable"

    def __init__(self, message: str, retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(message, field="model")
        self.retry_after_s = retry_after_s


class ModelTooLargeError(ServiceError):
    """A model whose served files alone exceed MODEL_MEMORY_BUDGET: it can never be loaded here."""

    kind = "model_too_large"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="model")


class ClientDisconnectedError(ServiceError):
    """The client closed the connection before its answer was ready; its work was cancelled."""

    kind = "client_closed_request"

    def __init__(self, message: str = "the client closed the connection") -> None:
        super().__init__(message)


@dataclass(frozen=True)
class FieldProblem:
    field: str | None
    message: str
    type: str  # machine-readable: ``string_too_long``, ``blank_text``, ``too_long``...


@dataclass(frozen=True)
class Problem:
    """One error as every door renders it: ``kind`` (``KINDS``) gives its HTTP status and gRPC code."""

    kind: str
    message: str
    field: str | None = None
    errors: tuple[FieldProblem, ...] = ()  # every field at fault (validation errors)
    retry_after_s: int | None = None
    status_override: int | None = None  # an HTTP status of the framework's own that no kind names
    headers: tuple[tuple[str, str], ...] = ()  # besides Retry-After (WWW-Authenticate, Allow, Connection)

    @property
    def status(self) -> int:
        return self.status_override or KINDS[self.kind].status

    @property
    def grpc(self) -> str:
        return KINDS[self.kind].grpc

    @property
    def text(self) -> str:
        """The message with its field first (``texts[0]: must not be empty``): gRPC's one line."""
        return f"{self.field}: {self.message}" if self.field else self.message

    @property
    def headline(self) -> str:
        """An error body's ``message``: a validation error names its field first, the others do not (their
        ``field`` says it beside)."""
        return self.text if self.kind == "validation_error" else self.message

    def response_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.retry_after_s is not None:
            out["Retry-After"] = str(self.retry_after_s)
        return out


class ProblemError(Exception):
    """A ``Problem`` decided before any handler ran (a quota refusal), raised where a door renders
    exceptions (the gRPC door)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def problem_of(exc: BaseException, where: str = "") -> Problem:
    """The ``Problem`` an exception is. A failure that is not the client's is logged here (``where``: the
    request, for the log), and its message says only to see the log."""
    if isinstance(exc, ProblemError):
        return exc.problem
    if isinstance(exc, InvalidInputError):
        return Problem(exc.kind, exc.message, exc.field, (FieldProblem(exc.field, exc.message, exc.reason),))
    if isinstance(exc, NotReadyError | ModelUnavailableError):
        return Problem(exc.kind, exc.message, retry_after_s=exc.retry_after_s)
    if isinstance(exc, ServiceError):
        return Problem(exc.kind, exc.message, exc.field)
    if isinstance(exc, QueueFullError):
        return Problem("queue_full", str(exc), retry_after_s=max(1, exc.retry_after_s))
    if isinstance(exc, DeadlineExceededError):
        return Problem("deadline_exceeded", str(exc))
    if isinstance(exc, QueueTimeoutError):
        return Problem("queue_timeout", str(exc), retry_after_s=DEFAULT_RETRY_AFTER_S)
    if isinstance(exc, BatcherClosedError):
        return Problem("unavailable", str(exc), retry_after_s=DEFAULT_RETRY_AFTER_S)
    if isinstance(exc, GenerationCancelledError):
        return Problem("cancelled", str(exc))
    if isinstance(exc, EngineError):
        log.error("inference failed%s: %s", f" ({where})" if where else "", exc)
        return Problem("internal_error", "inference failed; see the service log")
    log.error("unhandled error%s", f" on {where}" if where else "", exc_info=exc)
    return Problem("internal_error", "internal error; see the service log")
