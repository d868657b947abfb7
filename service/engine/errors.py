"""Engine errors: the HTTP layer maps each class to one response in a single handler table."""

from __future__ import annotations


def _rebuild(cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class EngineError(Exception):
    """Base of every error the engine raises on purpose. Copyable and picklable whatever a subclass's
    ``__init__`` takes; the split service's engine process sends it to the front end that made the request
    as a ``service/ipc/payloads.WireError``, its message and attributes as they are."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, self.__dict__)


class QueueFullError(EngineError):
    """The model's queue is at capacity; the client should come back after ``retry_after_s``.

    Raised at once instead of waiting, so an overloaded server answers 429/503 with
    ``Retry-After`` rather than letting connections pile up.
    """

    def __init__(self, model: str, depth: int, retry_after_s: int, displaced: bool = False) -> None:
        why = "a more urgent request took its place" if displaced else f"is full ({depth} waiting)"
        super().__init__(f"queue for model {model!r} {why}; retry after {retry_after_s}s")
        self.model = model
        self.depth = depth
        self.retry_after_s = retry_after_s
        self.displaced = displaced


class QueueTimeoutError(EngineError):
    """The request waited longer than the queue timeout before a batch picked it up."""

    def __init__(self, model: str, waited_s: float) -> None:
        super().__init__(f"request for model {model!r} waited {waited_s:.3f}s in the queue and timed out")
        self.model = model
        self.waited_s = waited_s


class DeadlineExceededError(EngineError):
    """The request's own deadline passed while its work waited: removed unanswered, never computed."""

    def __init__(self, model: str, waited_s: float) -> None:
        super().__init__(
            f"request for model {model!r} passed its deadline after waiting {waited_s:.3f}s in the queue; "
            "it was not computed"
        )
        self.model = model
        self.waited_s = waited_s


class BatcherClosedError(EngineError):
    """The batcher is not running (not started, shutting down, or stopped)."""

    def __init__(self, model: str, reason: str = "shutting down") -> None:
        super().__init__(f"model {model!r} is not accepting requests: {reason}")
        self.model = model
        self.reason = reason


class InferenceError(EngineError):
    """The model call failed for this item (ONNX Runtime raised); other items of its batch are unaffected."""

    def __init__(self, model: str, cause: BaseException) -> None:
        super().__init__(f"model {model!r} failed on this input: {type(cause).__name__}: {str(cause)[:500]}")
        self.model = model


class PromptError(EngineError):
    """A prompt the model cannot take: no tokens, ids outside its vocabulary, or no room for a new token.

    ``reason`` is the client-facing word (``empty``, ``too_long``, ``unknown_token``); ``index`` the
    prompt's place among those submitted together (``submit_all``).
    """

    def __init__(self, message: str, reason: str, index: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.index = index


class SessionFreedError(EngineError):
    """A graph's session was freed (its model was unloaded or replaced): nothing may run on it any more."""

    def __init__(self, graph: str) -> None:
        super().__init__(f"the session of {graph} was freed: its model was unloaded or replaced")
