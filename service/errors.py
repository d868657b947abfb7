"""Request-level domain errors: what a client did wrong, or why the service cannot answer now.

The engine's own errors (queue full, queue timeout, closed) live in
``service.engine.errors``; the HTTP layer maps both families to responses in
one exception-handler table (``service.api.http.errors``). Each error names the
request field at fault, so a client can fix the right thing.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the inference layer raises on purpose."""

    def __init__(self, message: str, field: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.index = index  # the item of the request at fault (its position among the inputs), if one


class InvalidInputError(ServiceError):
    """An input the schema accepted but the service cannot take (over a limit, undecodable image...).

    ``reason`` is a short machine-readable word for clients (``too_long``, ``undecodable_image``...).
    """

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


class ModelNotFoundError(ServiceError):
    """No loaded model has this name (it may have been refused at start-up: see GET /v1/models)."""

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


class NoModelForTaskError(ServiceError):
    """The request names no model and no loaded model serves its task."""

    def __init__(self, task: str) -> None:
        super().__init__(f"no loaded model serves {task}", field="model")
        self.task = task


class NotReadyError(ServiceError):
    """The service is starting or stopping; the client should retry after ``retry_after_s``."""

    def __init__(self, state: str, retry_after_s: int = 1) -> None:
        super().__init__(f"service is {state}, not ready for inference")
        self.state = state
        self.retry_after_s = retry_after_s
