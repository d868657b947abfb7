"""Streamed answers that own their generation: whenever the response ends, its sequences stop decoding.

A client may go away at any moment: before the response starts, between two events, or while the
last one is written. Cancelling from inside the event generator (``finally: stream.cancel()``) misses
the first case: Litestar's stream may be torn down before it ever starts the generator (its
Server-Sent Events iterator awaits a thread hop first), and a generator that never started runs no
``finally``. So the response itself owns the streams: its ASGI call cancels them when it returns or
raises, however far it got. ``cancel()`` of a sequence that finished is a no-op, so a stream that ran
to its end is untouched; one cut short leaves the running batch at the next step and is counted in
``tserve_requests_dropped_total``.

Every streaming door (``/v1/generate``, ``/v1/completions``, ``/v2/.../generate_stream``) answers
with one of these two classes.
"""

from __future__ import annotations

from typing import Any

from litestar.response import ServerSentEvent, Stream
from litestar.types import Receive, Scope, Send

from service.inference import GenerationStreams


class _CancelWhenOver:
    """An ASGI response that cancels ``streams`` once it is over, however it ends."""

    def __init__(self, response: Any, streams: GenerationStreams) -> None:
        self.response = response
        self.streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            await self.streams.close()


class _OwnsStreams:
    """Mixed into a Litestar streaming response: its ASGI response cancels ``self.streams`` when over."""

    streams: GenerationStreams

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        return _CancelWhenOver(super().to_asgi_response(*args, **kwargs), self.streams)  # type: ignore[misc]


class GenerationChunks(_OwnsStreams, Stream):
    """A ``Stream`` of raw chunks (OpenAI's ``data:`` lines) that owns ``streams``."""

    def __init__(self, content: Any, streams: GenerationStreams, **options: Any) -> None:
        super().__init__(content, **options)
        self.streams = streams


class GenerationEvents(_OwnsStreams, ServerSentEvent):
    """A ``ServerSentEvent`` response that owns ``streams``."""

    def __init__(self, content: Any, streams: GenerationStreams, **options: Any) -> None:
        super().__init__(content, **options)
        self.streams = streams
