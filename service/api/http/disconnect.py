"""Cancel a request's work when its client goes away, so its queued items never reach the model.

Litestar (like most ASGI frameworks) keeps running a handler after the client
disconnects. Once the body is read, the only thing the server still sends on
``receive`` is ``http.disconnect``; waiting for it beside the work lets the
handler cancel the work (the batcher drops cancelled entries; generation
cancels the sequences).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from service.errors import ClientDisconnectedError

T = TypeVar("T")


async def _wait_for_disconnect(request: Request[Any, Any, Any]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """The result of ``work``; if the client disconnects first, cancel it and raise ClientDisconnectedError."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnectedError()
    finally:
        watcher.cancel()
        if not task.done():  # our own caller was cancelled
            task.cancel()
        # The error task.result() raises carries this frame in its traceback, and the task holds the
        # error: a reference cycle that keeps the request (its whole body) alive until the garbage
        # collector's next full pass. Dropping the task breaks it, so the request is freed at once.
        del task
