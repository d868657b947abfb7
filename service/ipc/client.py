"""A front end's connection to the engine process: requests and their answers, streams, what serves.

``EngineClient`` sends a front end's requests on one DEALER socket, coalesced per turn of the loop
(``Outbox``), and answers them as the engine's ``Reply`` messages come back; a generation's ``Token`` and
``Ended`` messages feed the ``GenerationStream`` the front end gave the pipeline. From the engine's PUB
socket it learns what serves (``Models``, handed to ``on_models``) and that the engine lives
(``Heartbeat``): an engine silent for ``ENGINE_SILENT_S`` (killed, crashed, or being restarted by the
supervisor) is down: every request and stream in flight fails with 503 and Retry-After, and readiness
is false until a heartbeat of the new engine arrives.

Every request waits for its answer within a bound: its own deadline and a grace, or ``REPLY_BOUND_S``.
Past it, the request fails with 503 and the engine is told to abort it, as it is for every request in
flight when the engine is judged gone. A message that cannot be read fails the requests it names and the
loop goes on; a receive loop that stops for any other reason turns readiness to 503. A stall of this
front end's own loop (a blocked callback) is not the engine's silence: the heartbeats that arrived
meanwhile are read before the engine is judged.
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

from .channel import BadMessage, Frame, Outbox, decode_batch, decode_broadcast, endpoints, unbounded
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
from .payloads import CALLS, GENERATION, Payload

log = logging.getLogger(__name__)


REPLY_BOUND_S = 600.0  # how long a request without a deadline waits for the engine's answer at most
DEADLINE_GRACE_S = 2.0  # past a request's own deadline, how long the engine's own answer is awaited
STALLED_S = ENGINE_SILENT_S / 4  # a watcher tick this late: this front end's own loop stalled


def engine_gone() -> ModelUnavailableError:
    return ModelUnavailableError("the engine process is restarting; retry shortly", retry_after_s=1)


def _unanswered(why: str) -> ModelUnavailableError:
    return ModelUnavailableError(f"{why}; retry shortly", retry_after_s=1)


def _answer(payload: Payload | None, ok: bool, kind: Any) -> Any:
    """An answer's value (of type ``kind``), or the error it carries."""
    if payload is None:
        raise ValueError("an answer without its payload")
    return payload.value(kind) if ok else payload.error()


class EngineClient:
    def __init__(self, folder: Path, on_models: Callable[[Models], None]) -> None:
        self.folder = folder
        self.on_models = on_models
        self._context = zmq.asyncio.Context()
        self._dealer = self._context.socket(zmq.DEALER)
        self._sub = self._context.socket(zmq.SUB)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._answers: dict[int, Any] = {}  # request id -> the declared type of its answer (``payloads``)
        self._streams: dict[int, GenerationStream] = {}
        self._outbox = Outbox(self._send, self._unsendable)
        self._tasks: list[asyncio.Task[None]] = []
        self.broken = ""  # the receive loop that stopped, if one did: readiness stays 503
        self.epoch = 0.0  # the engine process's start (a new one: the old one died)
        self.engine_pid = 0
        self.last_heard = 0.0
        self.up = False
        self.depth: dict[str, dict[int, int]] = {}
        self._up_changed = asyncio.Event()

    # --- the sockets -------------------------------------------------------------------------------------

    async def start(self) -> None:
        requests, broadcast = endpoints(self.folder)
        unbounded(self._dealer)
        self._dealer.connect(requests)
        self._sub.setsockopt(zmq.LINGER, 0)  # broadcasts keep ZeroMQ's bound: each is sent again soon
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(broadcast)
        self._tasks = []
        for name, loop in (("receive", self._receive), ("listen", self._listen), ("watch", self._watch)):
            task = asyncio.ensure_future(loop())
            task.add_done_callback(lambda task, name=name: self._stopped(name, task))  # type: ignore[misc]
            self._tasks.append(task)
        self._hello()

    def _stopped(self, name: str, task: asyncio.Task[None]) -> None:
        """A loop that ends other than by ``stop``: this front end can no longer tell what the engine says."""
        if task.cancelled():
            return
        log.error("the front end's %s loop stopped (%r): readiness is 503 from now", name, task.exception())
        self.broken = name
        if self.up:
            self._set_up(False)
        self._fail_all()

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

    def _send(self, frames: list[Frame]) -> Any:
        return self._dealer.send_multipart(frames, copy=False)

    def _unsendable(self, envelope: Envelope, exc: BaseException) -> None:
        log.error("a %s could not be sent to the engine: %r", type(envelope).__name__, exc)
        if isinstance(envelope, Submit | Generate | Call):
            future = self._pending.get(envelope.id)
            if future is not None and not future.done():
                future.set_exception(_unanswered("the request could not be sent to the engine process"))

    def _put(self, envelope: Envelope, value: Any = None) -> None:
        self._outbox.put(envelope, value)

    # --- requests ----------------------------------------------------------------------------------------

    def _future(self, answer: Any, deadline: float | None = None) -> tuple[int, asyncio.Future[Any]]:
        """A new request's id and the future its answer (of type ``answer``) sets, failed (and the engine
        told to abort it) if no answer comes within its bound: ``deadline`` and a grace, else
        ``REPLY_BOUND_S``."""
        if not self.up:
            raise engine_gone()
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[request_id] = future
        self._answers[request_id] = answer
        bound = (
            REPLY_BOUND_S if deadline is None else max(0.0, deadline - time.monotonic()) + DEADLINE_GRACE_S
        )
        timer = loop.call_later(bound, self._unanswered_within, request_id, bound)
        future.add_done_callback(lambda _: timer.cancel())
        return request_id, future

    def _forget(self, request_id: int) -> None:
        self._pending.pop(request_id, None)
        self._answers.pop(request_id, None)

    def _unanswered_within(self, request_id: int, bound: float) -> None:
        future = self._pending.get(request_id)
        if future is not None and not future.done():
            log.error(
                "request %d had no answer from the engine within %.1f s: aborting it", request_id, bound
            )
            future.set_exception(_unanswered(f"the engine process gave no answer within {bound:.0f} s"))
            self._put(Abort([], [request_id]))

    async def submit(
        self,
        model: str,
        version: str,
        items: Sequence[Any],
        costs: Sequence[int],
        asked: Asked,
        results: Any = list[Any],
    ) -> list[Any]:
        """One request's items through the engine's dynamic batcher for ``model`` ``version``: their results
        (of type ``results``: ``payloads.results_of``) in order, or the error the engine raised. Cancelled,
        it withdraws its items still queued."""
        request_id, future = self._future(results, asked.deadline)
        self._put(Submit(request_id, model, version, list(costs), asked), list(items))
        try:
            return await future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._put(Abort([], [request_id]))
            raise
        finally:
            self._forget(request_id)

    async def generate(
        self, model: str, version: str, requests: Sequence[GenerationRequest], asked: Asked
    ) -> list[GenerationStream]:
        """Sequences queued in the engine's continuous batching, all or none (the engine's refusal is this
        call's error, as it is in one process); their streams, fed as the engine's steps come back."""
        request_id, future = self._future(None, asked.deadline)
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
            self._forget(request_id)
        return [stream for _, stream in streams]

    def _cancelled(self, stream_id: int) -> Callable[[GenerationStream], None]:
        def cancel(stream: GenerationStream) -> None:
            if self._streams.pop(stream_id, None) is not None:
                self._put(Abort([stream_id], []))

        return cancel

    async def call(self, op: str, *args: Any) -> tuple[Any, int]:
        """A call to the engine's model host (``server.EngineServer._operate``): its value, and the ``Models``
        generation that holds its effect."""
        request_id, future = self._future(tuple[CALLS[op][1], int])  # type: ignore[misc]
        self._put(Call(request_id, op), args)
        try:
            return await future  # type: ignore[no-any-return]
        finally:
            self._forget(request_id)

    # --- what comes back ---------------------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            parts = await self._dealer.recv_multipart(copy=False)
            try:
                received = decode_batch(parts)
            except BadMessage as bad:
                log.error("%s from the engine: failing the %d request(s) it names", bad, len(bad.envelopes))
                for envelope in bad.envelopes:
                    self._fail(envelope, _unanswered("the engine's answer could not be read"))
                continue
            for envelope, payload in received:
                try:
                    self._take(envelope, payload)
                except Exception as exc:  # one answer that cannot be taken fails its request, not the loop
                    log.exception("taking the engine's %s", type(envelope).__name__)
                    self._fail(envelope, _unanswered(f"the engine's answer could not be taken ({exc!r})"))

    def _take(self, envelope: Envelope, payload: Payload | None) -> None:
        """An answer, its payload decoded into the type declared for it (``payloads``): a payload that is
        not one raises, and ``_receive`` fails that request alone."""
        if isinstance(envelope, Token):
            stream = self._streams.get(envelope.stream)
            if stream is not None:
                logprob = None if payload is None else payload.value(GENERATION["token"])
                stream._push(TokenEvent(envelope.index, envelope.token_id, envelope.text, logprob))
        elif isinstance(envelope, Ended):
            stream = self._streams.get(envelope.stream)
            if stream is not None:
                outcome = _answer(payload, envelope.ok, GENERATION["result"])
                del self._streams[envelope.stream]
                if envelope.ok:
                    stream._finish(outcome)
                else:
                    stream._fail(outcome)
        elif isinstance(envelope, Reply):
            future = self._pending.get(envelope.id)
            if future is not None and not future.done():
                outcome = _answer(payload, envelope.ok, self._answers.get(envelope.id, Any))
                if envelope.ok:
                    future.set_result(outcome)
                else:
                    future.set_exception(outcome)

    def _fail(self, envelope: Envelope, error: BaseException) -> None:
        """The request or stream an answer that could not be read belongs to fails with ``error``."""
        if isinstance(envelope, Token | Ended):
            stream = self._streams.pop(envelope.stream, None)
            if stream is not None:
                stream._fail(error)
                self._put(Abort([envelope.stream], []))
        elif isinstance(envelope, Reply):
            future = self._pending.get(envelope.id)
            if future is not None and not future.done():
                future.set_exception(error)

    async def _listen(self) -> None:
        while True:
            data = await self._sub.recv()
            try:
                message = decode_broadcast(data)
            except Exception as exc:  # the next one is as good: broadcasts are sent again and again
                log.error("a broadcast from the engine that could not be read: %r", exc)
                continue
            if isinstance(message, Heartbeat):
                self.last_heard = time.monotonic()
                self.depth = message.depth
                if message.epoch != self.epoch:
                    if self.epoch:
                        log.warning("a new engine process (%d) is serving", message.pid)
                        self._hello()  # the new engine learns this front end's pid
                    self.epoch, self.engine_pid = message.epoch, message.pid
                if message.ready and not self.up and self._models_seen and not self.broken:
                    self._set_up(True)
                elif not message.ready and self.up:  # its own loop stopped, or it is closing
                    log.error("the engine says it is not ready: failing what waits on it")
                    self._set_up(False)
                    self._fail_all()
            elif isinstance(message, Models):
                self.on_models(message)
                self._models_seen = message.number

    _models_seen = 0

    async def _watch(self) -> None:
        period = ENGINE_SILENT_S / 4
        while True:
            slept = time.monotonic()
            await asyncio.sleep(period)
            now = time.monotonic()
            if now - slept - period > STALLED_S:
                # this loop was blocked: the heartbeats that came meanwhile wait unread in the socket, and
                # are read before the engine is judged (the next tick)
                log.warning("this front end's event loop stalled for %.1f s", now - slept - period)
                continue
            silent = self.last_heard and now - self.last_heard > ENGINE_SILENT_S
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
        """Every request and stream in flight fails with 503; the engine, if it still reads, aborts them
        (a new engine ignores ids it never had)."""
        requests = [request_id for request_id, future in self._pending.items() if not future.done()]
        for request_id in requests:
            self._pending[request_id].set_exception(engine_gone())
        streams = list(self._streams)
        for stream in list(self._streams.values()):
            stream._fail(engine_gone())
        self._streams.clear()
        if requests or streams:
            self._put(Abort(streams, requests))
