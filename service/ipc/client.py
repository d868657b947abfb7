"""A front end's connection to the engine process: requests and their answers, streams, what serves.

``EngineClient`` sends a front end's requests on one DEALER socket, coalesced per turn of the loop
(``Outbox``), and answers them as the engine's ``Reply`` messages come back; a generation's ``Token`` and
``Ended`` messages feed the ``GenerationStream`` the front end gave the pipeline. From the engine's PUB
socket it learns what serves (``Models``, handed to ``on_models``) and that the engine lives
(``Heartbeat``): an engine silent for ``ENGINE_SILENT_S`` (killed, crashed, or being restarted by the
supervisor) is down: every request and stream in flight fails with 503 and Retry-After, and readiness
is false until a heartbeat of the new engine arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from service.engine.generation_contract import GenerationRequest, TokenEvent
from service.engine.generation_stream import GenerationStream
from service.engine.scheduling import LOW
from service.errors import ModelUnavailableError
from service.process import alive

from .channel import Frame, Outbox, decode_batch, decode_broadcast, endpoints
from .messages import (
    ENGINE_SILENT_S,
    Abort,
    Asked,
    Call,
    Ended,
    Envelope,
    Generate,
    Heartbeat,
    Hello,
    Models,
    Reply,
    Submit,
    Token,
)

log = logging.getLogger(__name__)


def engine_gone() -> ModelUnavailableError:
    return ModelUnavailableError("the engine process is restarting; retry shortly", retry_after_s=1)


class EngineClient:
    def __init__(self, folder: Path, on_models: Callable[[Models], None]) -> None:
        self.folder = folder
        self.on_models = on_models
        self._context = zmq.asyncio.Context()
        self._dealer = self._context.socket(zmq.DEALER)
        self._sub = self._context.socket(zmq.SUB)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, GenerationStream] = {}
        self._outbox = Outbox(self._send)
        self._tasks: list[asyncio.Task[None]] = []
        self.epoch = 0.0  # the engine process's start (a new one: the old one died)
        self.engine_pid = 0
        self.last_heard = 0.0
        self.up = False
        self.depth: dict[str, dict[int, int]] = {}
        self._up_changed = asyncio.Event()

    # --- the sockets -------------------------------------------------------------------------------------

    async def start(self) -> None:
        requests, broadcast = endpoints(self.folder)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.connect(requests)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(broadcast)
        self._tasks = [
            asyncio.ensure_future(self._receive()),
            asyncio.ensure_future(self._listen()),
            asyncio.ensure_future(self._watch()),
        ]
        self._hello()

    def _hello(self) -> None:
        self._outbox.put(Hello(os.getpid()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._dealer.close(linger=0)
        self._sub.close(linger=0)
        self._context.term()

    async def wait_up(self, timeout_s: float) -> bool:
        """Whether the engine is up within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.up:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._up_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._up_changed.wait(), left)
        return True

    def urgent_waiting(self) -> int:
        """High- and normal-priority items waiting in the engine's queues, as it last published them."""
        return sum(n for by_class in self.depth.values() for c, n in by_class.items() if c < LOW)

    def _send(self, frames: list[Frame]) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._dealer.send_multipart(frames, copy=False)

    def _put(self, envelope: Envelope, value: Any = None) -> None:
        self._outbox.put(envelope, value)

    # --- requests ----------------------------------------------------------------------------------------

    def _future(self) -> tuple[int, asyncio.Future[Any]]:
        if not self.up:
            raise engine_gone()
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        return request_id, future

    async def submit(
        self, model: str, version: str, items: Sequence[Any], costs: Sequence[int], asked: Asked
    ) -> list[Any]:
        """One request's items through the engine's dynamic batcher for ``model`` ``version``: their results
        in order, or the error the engine raised. Cancelled, it withdraws its items still queued."""
        request_id, future = self._future()
        self._put(Submit(request_id, model, version, list(costs), asked), list(items))
        try:
            return await future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._put(Abort([], [request_id]))
            raise
        finally:
            self._pending.pop(request_id, None)

    async def generate(
        self, model: str, version: str, requests: Sequence[GenerationRequest], asked: Asked
    ) -> list[GenerationStream]:
        """Sequences queued in the engine's continuous batching, all or none (the engine's refusal is this
        call's error, as it is in one process); their streams, fed as the engine's steps come back."""
        request_id, future = self._future()
        streams = []
        for request in requests:
            stream_id = next(self._ids)
            stream = GenerationStream(request, model, self._cancelled(stream_id))
            self._streams[stream_id] = stream
            streams.append((stream_id, stream))
        ids = [stream_id for stream_id, _ in streams]
        self._put(Generate(request_id, model, version, ids, asked), list(requests))
        try:
            await future
        except BaseException:
            for stream_id, _ in streams:
                self._streams.pop(stream_id, None)
            if not future.done() or future.cancelled():
                self._put(Abort(ids, [request_id]))
            raise
        finally:
            self._pending.pop(request_id, None)
        return [stream for _, stream in streams]

    def _cancelled(self, stream_id: int) -> Callable[[GenerationStream], None]:
        def cancel(stream: GenerationStream) -> None:
            if self._streams.pop(stream_id, None) is not None:
                self._put(Abort([stream_id], []))

        return cancel

    async def call(self, op: str, *args: Any) -> tuple[Any, int]:
        """A call to the engine's model host (``server.EngineServer._operate``): its value, and the ``Models``
        generation that holds its effect."""
        request_id, future = self._future()
        self._put(Call(request_id, op), args)
        try:
            return await future  # type: ignore[no-any-return]
        finally:
            self._pending.pop(request_id, None)

    # --- what comes back ---------------------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            parts = await self._dealer.recv_multipart(copy=False)
            for envelope, payload in decode_batch(parts):
                if isinstance(envelope, Token):
                    stream = self._streams.get(envelope.stream)
                    if stream is not None:
                        stream._push(TokenEvent(envelope.index, envelope.token_id, envelope.text, payload))
                elif isinstance(envelope, Ended):
                    stream = self._streams.pop(envelope.stream, None)
                    if stream is not None:
                        if envelope.ok:
                            stream._finish(payload)
                        else:
                            stream._fail(payload)
                elif isinstance(envelope, Reply):
                    future = self._pending.get(envelope.id)
                    if future is not None and not future.done():
                        if envelope.ok:
                            future.set_result(payload)
                        else:
                            future.set_exception(payload)

    async def _listen(self) -> None:
        while True:
            message = decode_broadcast(await self._sub.recv())
            if isinstance(message, Heartbeat):
                self.last_heard = time.monotonic()
                self.depth = message.depth
                if message.epoch != self.epoch:
                    if self.epoch:
                        log.warning("a new engine process (%d) is serving", message.pid)
                        self._hello()  # the new engine learns this front end's pid
                    self.epoch, self.engine_pid = message.epoch, message.pid
                if message.ready and not self.up and self._models_seen:
                    self._set_up(True)
            elif isinstance(message, Models):
                self.on_models(message)
                self._models_seen = message.number

    _models_seen = 0

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(ENGINE_SILENT_S / 4)
            silent = self.last_heard and time.monotonic() - self.last_heard > ENGINE_SILENT_S
            if self.up and (silent or (self.engine_pid and not alive(self.engine_pid))):
                log.error("the engine process stopped answering: failing what waits on it")
                self._set_up(False)
                self._fail_all()

    def _set_up(self, up: bool) -> None:
        self.up = up
        if not up:
            self._models_seen = 0  # a new engine's models are awaited before serving again
        self._up_changed.set()

    def _fail_all(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(engine_gone())
        for stream in list(self._streams.values()):
            stream._fail(engine_gone())
        self._streams.clear()
