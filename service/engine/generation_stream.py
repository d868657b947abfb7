"""One request's stream: its token events as they come, its result, and ``cancel()`` for a client that left."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from .generation_contract import GenerationCancelledError, GenerationRequest, GenerationResult, TokenEvent


class StreamListener(Protocol):
    def on_event(self, stream: GenerationStream, event: TokenEvent) -> None: ...

    def on_result(self, stream: GenerationStream, result: GenerationResult) -> None: ...

    def on_error(self, stream: GenerationStream, error: BaseException) -> None: ...


class GenerationStream:
    """The caller's handle on one sequence: its token events, its result, and ``cancel()``.

    Events are kept, so a caller may iterate, await ``result()``, or both. Leaving
    the iteration early (``aclose``, ``break`` then garbage collection, or the
    iterating task being cancelled) cancels the sequence, as a client disconnect should.
    """

    def __init__(self, request: GenerationRequest, model: str, on_cancel: Callable[[GenerationStream], None]):
        self.request = request
        self._model = model
        self._on_cancel = on_cancel
        self._events: list[TokenEvent] = []
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._changed = asyncio.Event()
        self.on_end: Callable[[GenerationStream], None] | None = (
            None  # once, when it finishes, fails or is cancelled
        )
        # Told of every event, the result and an error as they happen, besides the iteration: how the split
        # service's engine process forwards a stream to the front end that owns it.
        self.listener: StreamListener | None = None

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled: no further events."""
        return self._result is not None or self._error is not None or self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def generated(self) -> int:
        """Tokens the engine made for this sequence so far: all of them once it finished; up to the step it
        left at when it was cancelled or failed (what a key is charged for a stream cut short)."""
        return self._result.completion_tokens if self._result is not None else len(self._events)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        """One event per generated token, in order; raises the sequence's error, ends at once when cancelled."""
        seen = 0
        try:
            while True:
                while seen < len(self._events) and not self._cancelled:
                    seen += 1
                    yield self._events[seen - 1]
                if self._error is not None:
                    raise self._error
                if self.done:
                    return
                await self._wait()
        finally:
            if not self.done:  # the consumer left before the end: the client went away
                self.cancel()

    async def result(self) -> GenerationResult:
        """The finished sequence; raises its error, or GenerationCancelledError after ``cancel()``."""
        while not self.done:
            await self._wait()
        if self._error is not None:
            error = self._error
            del self  # the error's traceback will hold this frame: without self, no cycle through the stream
            raise error
        if self._result is None:
            raise GenerationCancelledError(self._model)
        return self._result

    def cancel(self) -> None:
        """The client went away: no more events, and the sequence leaves the batch at the next step."""
        if self.done:
            return
        self._cancelled = True
        self._notify()
        self._on_cancel(self)
        self._ended()

    # engine side (event loop only)

    def _push(self, event: TokenEvent) -> None:
        if not self.done:
            self._events.append(event)
            self._notify()
            if self.listener is not None:
                self.listener.on_event(self, event)

    def _finish(self, result: GenerationResult) -> None:
        if not self.done:
            self._result = result
            self._notify()
            self._ended()
            if self.listener is not None:
                self.listener.on_result(self, result)

    def _fail(self, error: BaseException) -> None:
        if not self.done:
            self._error = error
            self._notify()
            self._ended()
            if self.listener is not None:
                self.listener.on_error(self, error)

    def _ended(self) -> None:
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end(self)

    def _notify(self) -> None:
        """Wake every waiter; the next waiters wait on a fresh event."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()
