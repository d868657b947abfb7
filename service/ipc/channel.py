"""ZeroMQ plumbing for ``messages.py``: payloads as frames, and an outbox that sends one message a turn.

``pack`` pickles a payload with protocol 5, every large buffer that supports it (numpy arrays of 64 KiB
or more) out of band: the array's memory becomes a frame of its own, which ZeroMQ sends without copying
it (``copy=False``), and ``unpack`` rebuilds the array over the received frame, again without a copy. A
small array (a request's logits) is copied into the pickle: a frame costs more than that copy.

``Outbox`` gathers a turn of the event loop's envelopes for one peer and sends them as one ``Batch`` at the
end of the turn (``loop.call_soon``): a front end's requests of a turn, an engine step's tokens for one
front end, in one message.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import zmq

from .messages import Batch, Broadcast, Envelope

_encode = msgspec.msgpack.Encoder().encode
_decode_batch = msgspec.msgpack.Decoder(Batch).decode
_decode_broadcast = msgspec.msgpack.Decoder(Broadcast).decode  # type: ignore[arg-type]

Frame = bytes | memoryview | zmq.Frame | pickle.PickleBuffer


# Buffers smaller than this travel inside the pickle: a frame of its own costs more than copying them.
OUT_OF_BAND_BYTES = 64 * 1024


def pack(value: Any) -> list[Frame]:
    """``value`` as frames: its pickle (protocol 5), then each large buffer out of band, a frame of its own."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_BYTES:
            return True  # in band
        buffers.append(buffer)
        return False

    data = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    return [data, *buffers]


def unpack(frames: Sequence[Frame]) -> Any:
    """What ``pack`` made frames of."""
    if not frames:
        return None
    first = frames[0]
    data = first.buffer if isinstance(first, zmq.Frame) else first
    buffers = [f.buffer if isinstance(f, zmq.Frame) else f for f in frames[1:]]
    return pickle.loads(data, buffers=buffers)


def encode_batch(envelopes: list[Envelope], values: list[Any]) -> list[Frame]:
    return [_encode(Batch(envelopes)), *(pack(values) if values else [])]


def decode_batch(parts: Sequence[Frame]) -> list[tuple[Envelope, Any]]:
    """Each envelope of a received ``Batch`` with its payload's value (None: it has none)."""
    head = parts[0]
    batch = _decode_batch(head.bytes if isinstance(head, zmq.Frame) else head)  # type: ignore[arg-type]
    values = unpack(parts[1:]) if len(parts) > 1 else []
    return [(e, values[e.payload] if e.payload >= 0 else None) for e in batch.envelopes]


def encode_broadcast(message: Broadcast) -> bytes:
    return _encode(message)


def decode_broadcast(data: bytes) -> Broadcast:
    return _decode_broadcast(data)  # type: ignore[no-any-return]


class Outbox:
    """One peer's envelopes of this turn of the loop, and their payloads, sent as one message once the turn
    ends: the payloads pickled together once."""

    def __init__(self, send: Callable[[list[Frame]], None]) -> None:
        self._send = send
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
        self._send(encode_batch(envelopes, values))


def ipc_folder() -> Path:
    """A private folder for the sockets (only this user may open it)."""
    folder = Path(tempfile.mkdtemp(prefix="tserve-ipc-"))
    os.chmod(folder, 0o700)
    return folder


def endpoints(folder: Path) -> tuple[str, str]:
    """The engine's request socket and its broadcast socket in ``folder``."""
    return f"ipc://{folder}/engine", f"ipc://{folder}/broadcast"
