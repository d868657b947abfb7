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

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar.response import Stream
from litestar.response.streaming import ASGIStreamingResponse
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


class _LeanStreamingResponse(ASGIStreamingResponse):
    """Litestar's streaming response, sending its chunks without anyio: Litestar runs the chunks and its
    listener for the client's disconnect in an anyio task group, which cost the event loop more per stream
    than a short generation's tokens (its backend lookup, a task handle, an event, a cancel scope). Here the
    chunks go from the response's own task, and one watcher task ends them when the client leaves, as the
    task group's cancel scope did: the response ends quietly, and ``_CancelWhenOver`` stops the sequences."""

    __slots__ = ()

    async def send_body(self, send: Send, receive: Receive) -> None:
        sending = asyncio.current_task()
        assert sending is not None, "sent from a task"
        left = False

        async def listen() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            sending.cancel()

        listener = asyncio.get_running_loop().create_task(listen())
        try:
            await self._stream(send)
        except asyncio.CancelledError:
            if not left:
                raise  # cancelled from outside: not ours to end quietly
            sending.uncancel()
        finally:
            listener.cancel()


class _OwnsStreams:
    """Mixed into a Litestar streaming response: its ASGI response cancels ``self.streams`` when over."""

    streams: GenerationStreams

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        response = super().to_asgi_response(*args, **kwargs)  # type: ignore[misc]
        if type(response) is ASGIStreamingResponse:
            response.__class__ = _LeanStreamingResponse  # the same object, sent without the task group
        return _CancelWhenOver(response, self.streams)


class GenerationChunks(_OwnsStreams, Stream):
    """A ``Stream`` of raw chunks (OpenAI's ``data:`` lines) that owns ``streams``."""

    def __init__(self, content: Any, streams: GenerationStreams, **options: Any) -> None:
        super().__init__(content, **options)
        self.streams = streams


class GenerationEvents(_OwnsStreams, Stream):
    """A ``text/event-stream`` of events already encoded (``sse_event``) that owns ``streams``: the headers
    of Litestar's ``ServerSentEvent``, without its per-event encoder (a message object, a ``StringIO`` and
    two regular expressions a token) nor its iterator wrappers."""

    def __init__(self, content: AsyncIterator[bytes], streams: GenerationStreams, **options: Any) -> None:
        super().__init__(content, media_type="text/event-stream", **options)
        self.headers.setdefault("Cache-Control", "no-cache")
        self.headers["Connection"] = "keep-alive"
        self.headers["X-Accel-Buffering"] = "no"
        self.streams = streams


def sse_event(data: bytes, event: bytes = b"") -> bytes:
    """One Server-Sent Event with one line of ``data`` (JSON never holds a raw line break), as Litestar's
    ``ServerSentEventMessage`` encodes it: ``event: E``, ``data: D``, each line ended by CRLF, then a blank
    line."""
    head = b"event: " + event + b"\r\n" if event else b""
    return head + b"data: " + data + b"\r\n\r\n"
