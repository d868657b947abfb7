"""The engine process's server: the model host's pipelines, driven by front ends over ``service/ipc``.

One ROUTER socket takes every front end's requests; each is handled as a task of its own on this
process's event loop, where the dynamic batchers, continuous batching, the priority queues and the
deadline timers run as they do in one process. Answers, and every token of an engine step, go back to
the front end that asked, one ZeroMQ message per front end per turn of the loop (``Outbox``). A PUB
socket tells every front end what serves (``Models``, after each change) and that the engine lives
(``Heartbeat``, with each model's queue by class, by which front ends shed low-priority work).

A front end's streams are forwarded by a listener on each engine-side stream (``GenerationStream.
listener``): no task per stream. A front end that dies is noticed within a second (its pid, from its
``Hello``): its sequences are cancelled and its requests withdrawn, the other front ends untouched.

The ROUTER queues without a high-water mark and is mandatory: an answer for a front end that has gone is
an error the engine sees (that front end's work is then dropped), never a silent drop. A message that
cannot be read fails the requests it names; an answer that cannot be encoded goes back as the error it
met. If the receive loop stops for any other reason, the heartbeats say the engine is not ready, and the
front ends answer 503. The heartbeat sends the last ``Models`` message again as it was built: the
repository's folders are read when what serves changes, not on the loop every two seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from opentelemetry import propagate
from opentelemetry.context import Context

from service.engine.errors import EngineError
from service.engine.generation_contract import GenerationResult, TokenEvent
from service.engine.generation_stream import GenerationStream
from service.engine.scheduling import Ceiling, Scheduling
from service.ipc.channel import (
    BadMessage,
    Frame,
    Outbox,
    Unsendable,
    decode_batch,
    encode_broadcast,
    endpoints,
    unbounded,
)
from service.ipc.messages import (
    HEARTBEAT_S,
    Abort,
    Asked,
    Call,
    Ended,
    Envelope,
    Generate,
    Heartbeat,
    Hello,
    Models,
    ModelVersion,
    Reply,
    State,
    Submit,
    Token,
)
from service.ipc.payloads import CALLS, GENERATION, Payload, items_of
from service.metadata import RequestMeta
from service.models.host import ModelHost
from service.pipelines.factory import PIPELINES
from service.pipelines.local_workers import COMPUTE
from service.process import alive

log = logging.getLogger(__name__)


def _decoded(payload: Payload | None, kind: Any) -> Any:
    """A request's payload as its declared type; an error naming it when it is not one (the request fails)."""
    if payload is None:
        raise EngineError("the request came without its payload")
    try:
        return payload.value(kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EngineError(f"the request's payload could not be decoded: {exc}") from exc


def _meta(asked: Asked) -> RequestMeta:
    """A front end's request as the engine's queues take it: its scheduling and its trace."""
    trace: Context | None = propagate.extract(asked.trace) if asked.trace else None
    return RequestMeta(
        scheduling=Scheduling(asked.priority, asked.deadline, Ceiling(asked.most_urgent)), trace=trace
    )


class _Frontend:
    """One connected front end: its identity on the ROUTER, its pid, its outbox, its work in flight."""

    def __init__(self, identity: bytes, send: Callable[[list[Frame]], Any], unsendable: Unsendable) -> None:
        self.identity = identity
        self.pid = 0
        self.outbox = Outbox(send, unsendable)
        self.streams: dict[int, GenerationStream] = {}  # its stream id -> the engine's stream
        self.tasks: dict[int, asyncio.Task[None]] = {}  # request id -> the task answering it


class _Forward:
    """The listener of one engine-side stream: its events to the front end that owns it."""

    __slots__ = ("frontend", "stream_id")

    def __init__(self, frontend: _Frontend, stream_id: int) -> None:
        self.frontend = frontend
        self.stream_id = stream_id

    def on_event(self, stream: GenerationStream, event: TokenEvent) -> None:
        token = Token(self.stream_id, event.index, event.token_id, event.text)
        self.frontend.outbox.put(token, event.logprob)

    def on_result(self, stream: GenerationStream, result: GenerationResult) -> None:
        self.frontend.outbox.put(Ended(self.stream_id, True), result, has_value=True)
        self.frontend.streams.pop(self.stream_id, None)

    def on_error(self, stream: GenerationStream, error: BaseException) -> None:
        self.frontend.outbox.put(Ended(self.stream_id, False), error, has_value=True)
        self.frontend.streams.pop(self.stream_id, None)


class EngineServer:
    def __init__(self, host: ModelHost, folder: Path) -> None:
        self.host = host
        self.folder = folder
        self.epoch = time.time()
        self.ready = False
        self._number = 0  # the Models generation
        self._frontends: dict[bytes, _Frontend] = {}
        self._context = zmq.asyncio.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._pub = self._context.socket(zmq.PUB)
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = asyncio.Event()
        self._models_message = b""  # the last Models broadcast, as encoded

    # --- the sockets -------------------------------------------------------------------------------------

    def bind(self) -> None:
        requests, broadcast = endpoints(self.folder)
        unbounded(self._router)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an answer to a vanished front end is an error
        self._router.bind(requests)
        self._pub.bind(broadcast)
        self.host.on_change = self.broadcast_models

    async def serve(self) -> None:
        """Answer front ends until ``close``."""
        self.ready = True
        self.broadcast_models()
        self._tasks = []
        for name, loop in (
            ("receive", self._receive),
            ("heartbeat", self._heartbeat),
            ("watch", self._watch_frontends),
        ):
            task = asyncio.ensure_future(loop())
            task.add_done_callback(lambda task, name=name: self._stopped(name, task))  # type: ignore[misc]
            self._tasks.append(task)
        await self._closed.wait()

    def _stopped(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        log.error("the engine's %s loop stopped (%r): not ready from now", name, task.exception())
        self.ready = False
        if name != "heartbeat":  # the heartbeat says so; with it gone, the front ends hear silence
            with contextlib.suppress(zmq.ZMQError):
                self._pub.send(encode_broadcast(Heartbeat(os.getpid(), self.epoch, False, {})))

    async def close(self) -> None:
        self.ready = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._closed.set()
        self._router.close(linger=0)
        self._pub.close(linger=0)
        self._context.term()

    def _frontend(self, identity: bytes) -> _Frontend:
        frontend = self._frontends.get(identity)
        if frontend is None:

            def send(frames: list[Frame]) -> Any:
                return self._router.send_multipart([identity, *frames], copy=False)

            def unsendable(envelope: Envelope, exc: BaseException) -> None:
                self._unsendable(identity, envelope, exc)

            frontend = self._frontends[identity] = _Frontend(identity, send, unsendable)
        return frontend

    def _unsendable(self, identity: bytes, envelope: Envelope, exc: BaseException) -> None:
        frontend = self._frontends.get(identity)
        if frontend is None:
            return
        if isinstance(exc, zmq.ZMQError) and exc.errno == errno.EHOSTUNREACH:
            self._drop(identity, "its socket is gone")
            return
        log.error("an answer for front end %d could not be sent (%r): sending the error", frontend.pid, exc)
        error = EngineError(f"the engine's answer could not be sent: {type(exc).__name__}: {str(exc)[:200]}")
        if isinstance(envelope, Reply) and envelope.ok:
            frontend.outbox.put(Reply(envelope.id, False), error, has_value=True)
        elif isinstance(envelope, Ended | Token):
            stream = frontend.streams.pop(envelope.stream, None)
            if stream is not None:
                stream.cancel()
            frontend.outbox.put(Ended(envelope.stream, False), error, has_value=True)

    async def _receive(self) -> None:
        while True:
            identity, *parts = await self._router.recv_multipart(copy=False)
            frontend = self._frontend(identity.bytes)
            try:
                received = decode_batch(parts)
            except BadMessage as bad:
                log.error("%s from front end %d: failing what it names", bad, frontend.pid)
                for envelope in bad.envelopes:
                    if isinstance(envelope, Submit | Generate | Call):
                        self._reply(frontend, envelope.id, False, EngineError(str(bad)))
                continue
            for envelope, payload in received:
                try:
                    self._dispatch(frontend, envelope, payload)
                except Exception as exc:  # one request that cannot be started fails, not the loop
                    log.exception("dispatching a %s", type(envelope).__name__)
                    if isinstance(envelope, Submit | Generate | Call):
                        self._reply(frontend, envelope.id, False, EngineError(f"cannot be started: {exc!r}"))

    def _dispatch(self, frontend: _Frontend, envelope: Any, payload: Any) -> None:
        if isinstance(envelope, Submit):
            self._start(frontend, envelope.id, self._submit(frontend, envelope, payload))
        elif isinstance(envelope, Generate):
            self._start(frontend, envelope.id, self._generate(frontend, envelope, payload))
        elif isinstance(envelope, Call):
            self._start(frontend, envelope.id, self._call(frontend, envelope, payload))
        elif isinstance(envelope, Abort):
            for stream_id in envelope.streams:
                stream = frontend.streams.pop(stream_id, None)
                if stream is not None:
                    stream.cancel()  # twice is as once: a finished or cancelled stream ignores it
            for request_id in envelope.requests:
                task = frontend.tasks.get(request_id)
                if task is not None:
                    task.cancel()  # its items still queued are withdrawn (DynamicBatcher.submit_all)
        elif isinstance(envelope, Hello):
            frontend.pid = envelope.pid
            log.info("front end %d connected", envelope.pid)

    def _start(self, frontend: _Frontend, request_id: int, work: Any) -> None:
        task = asyncio.ensure_future(work)
        frontend.tasks[request_id] = task
        task.add_done_callback(lambda _: frontend.tasks.pop(request_id, None))

    def _reply(self, frontend: _Frontend, request_id: int, ok: bool, value: Any) -> None:
        frontend.outbox.put(Reply(request_id, ok), value, has_value=True)

    # --- the requests ------------------------------------------------------------------------------------

    async def _submit(self, frontend: _Frontend, msg: Submit, payload: Payload | None) -> None:
        try:
            pipeline = self.host.registry.get(msg.model, msg.version)
            items = _decoded(payload, items_of(pipeline.task))
            with pipeline.leased():
                results = await pipeline.batcher.submit_all(  # type: ignore[attr-defined]
                    items, msg.costs, None, _meta(msg.asked)
                )
        except asyncio.CancelledError:
            return  # the front end withdrew it: nobody waits for an answer
        except Exception as exc:
            self._reply(frontend, msg.id, False, exc)
            return
        self._reply(frontend, msg.id, True, results)

    async def _generate(self, frontend: _Frontend, msg: Generate, payload: Payload | None) -> None:
        try:
            pipeline = self.host.registry.get(msg.model, msg.version)
            requests = _decoded(payload, GENERATION["requests"])
            with pipeline.leased():
                streams = await pipeline.engine.admit_all(  # type: ignore[attr-defined]
                    requests, None, _meta(msg.asked)
                )
        except Exception as exc:
            self._reply(frontend, msg.id, False, exc)
            return
        for stream_id, stream in zip(msg.streams, streams, strict=True):
            stream.listener = _Forward(frontend, stream_id)
            frontend.streams[stream_id] = stream
        self._reply(frontend, msg.id, True, None)

    async def _call(self, frontend: _Frontend, msg: Call, payload: Payload | None) -> None:
        try:
            if msg.op not in CALLS:
                raise ValueError(f"unknown call {msg.op!r}")
            args = _decoded(payload, CALLS[msg.op][0])
            value = await self._operate(msg.op, *args)
        except Exception as exc:
            self._reply(frontend, msg.id, False, exc)
            return
        self.broadcast_models()  # a load, an unload or an on-demand load changed what serves
        self._reply(frontend, msg.id, True, (value, self._number))

    async def _operate(self, op: str, *args: Any) -> Any:
        host = self.host
        if op == "resident":
            await host.resident(*args)
            return None
        if op == "load":
            await host.load(*args)
            return None
        if op == "unload":
            await host.unload(*args)
            return None
        if op == "compute":
            model, version, method, method_args = args
            if method not in COMPUTE:
                raise ValueError(f"{method!r} is not a method a front end may run")
            pipeline = host.registry.get(model, version)
            with pipeline.leased():
                return await getattr(pipeline, method)(*method_args)
        raise ValueError(f"unknown call {op!r}")

    # --- what every front end must know ------------------------------------------------------------------

    def broadcast_models(self) -> None:
        self._number += 1
        host = self.host
        versions = []
        for name, pipelines in host.registry.versions.items():
            for pipeline in pipelines:
                model = pipeline.model
                folder = model.path.parent if model.label else model.path
                versions.append(
                    ModelVersion(
                        name, str(folder), model.label, model.version, model.variant.name, model.provider
                    )
                )
        lookup = host.lookup  # the front ends' mirrors answer with the same rules over what this says
        folders = list(lookup.offer.folders())
        defaults = dict(host.registry.defaults)
        for task in PIPELINES:  # and, with a budget, the folder that would load for a task none serves
            if task not in defaults and (chosen := lookup.target(None, task)) is not None:
                defaults[task] = chosen
        message = Models(
            self._number,
            versions,
            dict(host.registry.refused),
            [State(s.name, s.version, s.state, s.reason) for s in host.repository()],
            folders,
            [n for n in folders if n not in host.registry.versions and lookup.loads_on_demand(n)],
            defaults,
        )
        self._models_message = encode_broadcast(message)
        with contextlib.suppress(zmq.ZMQError):
            self._pub.send(self._models_message)

    async def _heartbeat(self) -> None:
        pid = os.getpid()
        models_every = max(1, int(2.0 / HEARTBEAT_S))  # a late front end hears what serves within 2 s
        beat = 0
        while True:
            depth = {
                name: pipeline.waiting_by_class() for name, pipeline in self.host.registry.pipelines.items()
            }
            with contextlib.suppress(zmq.ZMQError):
                self._pub.send(encode_broadcast(Heartbeat(pid, self.epoch, self.ready, depth)))
            beat += 1
            if beat % models_every == 0 and self._models_message:  # as built at the last change
                with contextlib.suppress(zmq.ZMQError):
                    self._pub.send(self._models_message)
            await asyncio.sleep(HEARTBEAT_S)

    async def _watch_frontends(self) -> None:
        """A front end whose process is gone: its sequences cancelled, its requests withdrawn."""
        while True:
            await asyncio.sleep(1.0)
            for identity, frontend in list(self._frontends.items()):
                if frontend.pid and not alive(frontend.pid):
                    self._drop(identity, "its process is gone")

    def _drop(self, identity: bytes, why: str) -> None:
        """A front end that is gone: its sequences cancelled, its requests withdrawn."""
        frontend = self._frontends.pop(identity, None)
        if frontend is None:
            return
        log.warning(
            "front end %d is gone (%s): cancelling its %d sequence(s) and %d request(s)",
            frontend.pid,
            why,
            len(frontend.streams),
            len(frontend.tasks),
        )
        for stream in list(frontend.streams.values()):
            stream.cancel()
        for task in list(frontend.tasks.values()):
            task.cancel()
