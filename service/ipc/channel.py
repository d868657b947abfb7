"""ZeroMQ plumbing for ``messages.py``: payloads as frames, and an outbox that sends one message a turn.

The payloads are typed and encoded by ``payloads.py`` (msgspec, MessagePack; large arrays out of band, a
frame each, sent and received without a copy): a received message's payloads stay undecoded until their
reader names the type each must be.

``Outbox`` gathers a turn of the event loop's envelopes for one peer and sends them as one ``Batch`` at the
end of the turn (``loop.call_soon``): a front end's requests of a turn, an engine step's tokens for one
front end, in one message.

Nothing is lost silently. The request sockets queue without a high-water mark (``unbounded``): the bound is
the engine's queue (MAX_QUEUE_SIZE, checked as it admits) and each request's own bound at the front end,
not ZeroMQ dropping a reply at its default of 1,000 messages. A batch that cannot be encoded, or a send
that fails, hands each of its envelopes to the outbox's ``on_unsendable``, which fails that one request.
A received message that cannot be decoded raises ``BadMessage`` with the envelopes it could read, so the
receiver fails those requests and keeps its loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import zmq

from .messages import Batch, Broadcast, Envelope
from .payloads import Payload, decode_values, encode_values

log = logging.getLogger(__name__)

_encode = msgspec.msgpack.Encoder().encode
_decode_batch = msgspec.msgpack.Decoder(Batch).decode
_decode_broadcast = msgspec.msgpack.Decoder(Broadcast).decode  # type: ignore[arg-type]

Frame = bytes | memoryview | zmq.Frame


def encode_batch(envelopes: list[Envelope], values: list[Any]) -> list[Frame]:
    """One message: the envelopes, then their payloads' frames (``TypeError``: a value of no declared type)."""
    return [_encode(Batch(envelopes)), *(encode_values(values) if values else [])]


class BadMessage(Exception):
    """A received message that could not be decoded: ``envelopes`` are those that could be read (their
    requests fail; none when the head itself was unreadable)."""

    def __init__(self, envelopes: list[Envelope], cause: BaseException) -> None:
        super().__init__(f"a message that could not be decoded: {type(cause).__name__}: {str(cause)[:200]}")
        self.envelopes = envelopes


def decode_batch(parts: Sequence[Frame]) -> list[tuple[Envelope, Payload | None]]:
    """Each envelope of a received ``Batch`` with its payload, still to be decoded into its type (None: it has
    none); ``BadMessage`` if the message is not one."""
    if not parts:
        raise BadMessage([], ValueError("an empty message"))
    head, *rest = (p.buffer if isinstance(p, zmq.Frame) else p for p in parts)
    try:
        batch = _decode_batch(head)
    except Exception as exc:
        raise BadMessage([], exc) from exc
    try:
        values = decode_values(rest) if rest else []
        return [(e, values[e.payload] if e.payload >= 0 else None) for e in batch.envelopes]
    except Exception as exc:
        raise BadMessage(list(batch.envelopes), exc) from exc


def unbounded(socket: zmq.Socket[Any]) -> None:
    """No high-water mark either way, and nothing kept after close (module docstring: where the bound is)."""
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)


def encode_broadcast(message: Broadcast) -> bytes:
    return _encode(message)


def decode_broadcast(data: bytes) -> Broadcast:
    return _decode_broadcast(data)  # type: ignore[no-any-return]


Unsendable = Callable[[Envelope, BaseException], None]


class Outbox:
    """One peer's envelopes of this turn of the loop, and their payloads, sent as one message once the turn
    ends: the payloads encoded together once. ``send`` raises, or returns a future that fails, when the
    message could not be sent; ``on_unsendable`` then hears of each envelope that did not go."""

    def __init__(self, send: Callable[[list[Frame]], Any], on_unsendable: Unsendable) -> None:
        self._send = send
        self._on_unsendable = on_unsendable
        self._envelopes: list[Envelope] = []
        self._values: list[Any] = []
        self._scheduled = False

    def put(self, envelope: Envelope, value: Any = None, has_value: bool = False) -> None:
        """Queue ``envelope``, with ``value`` as its payload when ``has_value`` (or ``value`` is not None)."""
        if has_value or value is not None:
            envelope.payload = len(self._values)
            self._values.append(value)
        self._envelopes.append(envelope)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._envelopes:
            return
        envelopes, values = self._envelopes, self._values
        self._envelopes, self._values = [], []
        try:
            frames = encode_batch(envelopes, values)
        except Exception:  # one payload of no declared type: the others go, one message each
            for envelope in envelopes:
                self._send_alone(envelope, values)
            return
        self._deliver(frames, envelopes)

    def _send_alone(self, envelope: Envelope, values: list[Any]) -> None:
        has_value = envelope.payload >= 0
        value = values[envelope.payload] if has_value else None
        if has_value:
            envelope.payload = 0
        try:
            frames = encode_batch([envelope], [value] if has_value else [])
        except Exception as exc:
            self._unsendable([envelope], exc)
            return
        self._deliver(frames, [envelope])

    def _deliver(self, frames: list[Frame], envelopes: list[Envelope]) -> None:
        try:
            sent = self._send(frames)
        except Exception as exc:
            self._unsendable(envelopes, exc)
            return
        if isinstance(sent, asyncio.Future):  # zmq.asyncio: done at once without a high-water mark
            sent.add_done_callback(lambda f: self._sent(f, envelopes))

    def _sent(self, future: asyncio.Future[Any], envelopes: list[Envelope]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._unsendable(envelopes, future.exception())  # type: ignore[arg-type]

    def _unsendable(self, envelopes: list[Envelope], exc: BaseException) -> None:
        for envelope in envelopes:
            try:
                self._on_unsendable(envelope, exc)
            except Exception:  # the loop that flushes must go on whatever a handler does
                log.exception("handling an unsendable %s", type(envelope).__name__)


def ipc_folder() -> Path:
    """A private folder for the sockets (only this user may open it)."""
    folder = Path(tempfile.mkdtemp(prefix="tserve-ipc-"))
    os.chmod(folder, 0o700)
    return folder


def endpoints(folder: Path) -> tuple[str, str]:
    """The engine's request socket and its broadcast socket in ``folder``."""
    return f"ipc://{folder}/engine", f"ipc://{folder}/broadcast"
