"""What crosses between a front end and the engine besides the envelopes: every payload's type, declared here.

The envelopes (``messages.py``) are msgspec structs; their payloads (a request's task items, their results,
a generation's requests, tokens and result, a call's arguments and value, an error) are typed too, by the
tables below, and encoded by msgspec as MessagePack, never pickled. A payload is decoded into its declared
type, and nothing else: a value the tables do not declare fails to encode (its request fails, alone), and
one that does not decode into its type fails its request, not the loop that read it.

- ``ITEMS`` and ``RESULTS``: per task, one item of a request and one result, as the pipeline's
  ``run_batch`` takes and returns them. The front end's pipeline encodes the items; the engine decodes
  them into the type of the pipeline that serves the named version.
- ``GENERATION``: a generation's requests, each token's log-probabilities and the sequence's result.
- ``CALLS``: per operation on the engine's model host, its arguments and its value.
- Errors: every ``ServiceError`` and ``EngineError`` of ``ERROR_MODULES`` crosses as a ``WireError``, its
  class named and its attributes kept, and is rebuilt as it was; any other exception crosses as an
  ``EngineError`` with its message.

Arrays: a numpy array is a MessagePack extension holding its dtype and shape; its bytes are inline when
small, and a frame of their own when large (``OUT_OF_BAND_BYTES``), which ZeroMQ sends without a copy and
the receiver wraps without one.

The declared types' fields are the protocol: ``tests/test_split.py`` compares their description
(``describe``) with ``tests/wire_protocol.json``, so a field added to an item or a result, a task or an
operation, changes that file on purpose or fails the test.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
import types
import typing
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from service.engine.errors import EngineError
from service.engine.generation_contract import GenerationRequest, GenerationResult
from service.engine.sampling import TokenLogprob
from service.engine.seq2seq import Hypothesis
from service.errors import ServiceError
from service.pipelines.attention import Selection
from service.pipelines.classify import PairIds
from service.pipelines.embed import Vectors
from service.pipelines.qa_spans import QAWindow, Span
from service.pipelines.translate import SourceItem

# --- the declared types ----------------------------------------------------------------------------------

ITEMS: dict[str, Any] = {
    "text-classification": list[int] | PairIds,
    "image-classification": np.ndarray,  # decoded pixels
    "translation": SourceItem,
    "question-answering": list[QAWindow],  # one question's windows over its context
    "token-classification": list[int],
    "feature-extraction": list[int],
    "rerank": PairIds,  # one (query, document) pair
}

RESULTS: dict[str, Any] = {
    "text-classification": np.ndarray,  # the labels' probabilities
    "image-classification": np.ndarray,
    "translation": list[Hypothesis],
    "question-answering": Span | None,
    "token-classification": np.ndarray,  # each token's labels' probabilities
    "feature-extraction": Vectors,
    "rerank": float,  # the pair's logit
}

GENERATION: dict[str, Any] = {
    "requests": list[GenerationRequest],
    "token": TokenLogprob | None,  # with a token, when the request asked for log-probabilities
    "result": GenerationResult,
}

# op -> (its arguments, its value); a call's answer is (value, the ``Models`` generation holding its effect)
CALLS: dict[str, tuple[Any, Any]] = {
    "resident": (tuple[str | None, str | None], None),  # (model, task): loaded on demand if it may be
    "load": (tuple[str], None),
    "unload": (tuple[str], None),
    # (model, version, method, its arguments): a pipeline's method on the model's compute thread
    "compute": (tuple[str, str, str, tuple[dict[str, np.ndarray], Selection]], np.ndarray),
}


def items_of(task: str) -> Any:
    """A request's items for a model of ``task``, as the engine decodes them (``KeyError``: undeclared)."""
    return list[ITEMS[task]]  # type: ignore[valid-type]


def results_of(task: str) -> Any:
    """A request's results from a model of ``task``, as a front end decodes them."""
    return list[RESULTS[task]]  # type: ignore[valid-type]


class WireError(msgspec.Struct, frozen=True):
    """An error as it crosses: its class (module and name), its args, and its attributes."""

    cls: str
    args: list[Any]
    state: dict[str, Any]


# The modules whose errors cross as themselves: both sides import them (this module does), so an error of
# one is rebuilt as its own class on the other side whatever else either process imported.
ERROR_MODULES = ("service.errors", "service.engine.errors", "service.engine.generation_contract")


def _declared_errors() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    frontier: list[type[BaseException]] = [ServiceError, EngineError]
    while frontier:
        cls = frontier.pop()
        if cls.__module__ in ERROR_MODULES:
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        frontier.extend(cls.__subclasses__())
    return found


def _plain(value: Any) -> Any:
    """``value`` if MessagePack carries it as it is (numbers, text, lists, maps of them); else its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    return repr(value)


def wire_error(error: BaseException) -> WireError:
    if isinstance(error, ServiceError | EngineError) and type(error).__module__ in ERROR_MODULES:
        cls = type(error)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in _declared_errors():
            return WireError(name, _plain(list(error.args)), {k: _plain(v) for k, v in vars(error).items()})
    message = f"{type(error).__name__}: {error}"
    return WireError(f"{EngineError.__module__}.{EngineError.__qualname__}", [message], {})


def rebuilt(error: WireError) -> BaseException:
    """The error ``wire_error`` described: its class (an ``EngineError`` if this side does not know it)."""
    cls = _declared_errors().get(error.cls)
    if cls is None:
        return EngineError(f"{error.cls}: {error.args[0] if error.args else ''}")
    rebuilt = cls.__new__(cls)
    rebuilt.args = tuple(error.args)
    rebuilt.__dict__.update(error.state)
    return rebuilt


# --- the codec ----------------------------------------------------------------------------------------------

# Arrays smaller than this travel inside the message: a frame of their own costs more than copying them.
OUT_OF_BAND_BYTES = 64 * 1024
_INLINE, _FRAME = 1, 2  # the MessagePack extension codes of an array

Frame = Any  # bytes, a memoryview, a zmq.Frame's buffer


class _Buffers(threading.local):
    """The frames of the message being encoded or decoded, on this thread."""

    def __init__(self) -> None:
        self.frames: list[Any] = []


_buffers = _Buffers()


def _array_header(array: np.ndarray, index: int = -1) -> bytes:
    dtype = array.dtype.str.encode()
    return struct.pack(f"<B{len(dtype)}sBi{array.ndim}q", len(dtype), dtype, array.ndim, index, *array.shape)


def _enc_hook(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        if array.dtype.hasobject:
            raise TypeError("an array of Python objects does not cross")
        if array.nbytes < OUT_OF_BAND_BYTES:
            return msgspec.msgpack.Ext(_INLINE, _array_header(array) + array.tobytes())
        _buffers.frames.append(memoryview(array).cast("B"))  # type: ignore[arg-type]
        return msgspec.msgpack.Ext(_FRAME, _array_header(array, len(_buffers.frames) - 1))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, BaseException):
        return wire_error(value)
    raise TypeError(f"{type(value).__module__}.{type(value).__qualname__} is not a declared payload type")


def _ext_hook(code: int, data: memoryview) -> np.ndarray:
    (length,) = struct.unpack_from("<B", data)
    (dtype,) = struct.unpack_from(f"<{length}s", data, 1)
    ndim, index = struct.unpack_from("<Bi", data, 1 + length)
    at = 1 + length + 5
    shape = struct.unpack_from(f"<{ndim}q", data, at)
    at += 8 * ndim
    if code == _INLINE:
        # copied: the array outlives the message's buffer, and may be written to
        return np.frombuffer(bytes(data[at:]), dtype=np.dtype(dtype.decode())).reshape(shape)
    if code == _FRAME:
        return np.frombuffer(_buffers.frames[index], dtype=np.dtype(dtype.decode())).reshape(shape)
    raise ValueError(f"an unknown extension {code}")


def _dec_hook(kind: type, value: Any) -> Any:
    if kind is np.ndarray and isinstance(value, np.ndarray):
        return value
    raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decode_raw = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def encode_values(values: Sequence[Any]) -> list[Frame]:
    """``values`` as frames: one MessagePack array of them, then each large array's bytes out of band.
    ``TypeError`` when a value is of no declared type."""
    _buffers.frames = []
    try:
        head = _encoder.encode(list(values))
        return [head, *_buffers.frames]
    finally:
        _buffers.frames = []


class Payload:
    """One received payload, undecoded until its reader says what type it must be."""

    __slots__ = ("_frames", "_raw")

    def __init__(self, raw: msgspec.Raw, frames: list[Any]) -> None:
        self._raw = raw
        self._frames = frames

    def value(self, kind: Any) -> Any:
        """The payload as ``kind``; ``msgspec.ValidationError`` or ``DecodeError`` when it is not one."""
        decoder = _decoders.get(kind)
        if decoder is None:
            decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind, ext_hook=_ext_hook, dec_hook=_dec_hook)
        _buffers.frames = self._frames
        try:
            return decoder.decode(self._raw)
        finally:
            _buffers.frames = []

    def error(self) -> BaseException:
        """The payload as the error it describes."""
        return rebuilt(self.value(WireError))


def decode_values(frames: Sequence[Any]) -> list[Payload]:
    """What ``encode_values`` made frames of, each value still to be decoded into its type."""
    raws = _decode_raw(frames[0])
    rest = list(frames[1:])
    return [Payload(raw, rest) for raw in raws]


# --- the protocol's description ------------------------------------------------------------------------------


def describe(kind: Any) -> Any:
    """A type as the wire sees it, as JSON: a dataclass's or struct's fields, recursively; a union's members."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return {"union": [describe(k) for k in typing.get_args(kind)]}
    if origin is not None:
        return {getattr(origin, "__name__", str(origin)): [describe(k) for k in typing.get_args(kind)]}
    if kind is None or kind is type(None):
        return "None"
    if dataclasses.is_dataclass(kind) or (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        hints = typing.get_type_hints(kind)
        names = (
            [f.name for f in dataclasses.fields(kind)]
            if dataclasses.is_dataclass(kind)
            else list(kind.__struct_fields__)  # type: ignore[union-attr]
        )
        return {kind.__qualname__: {name: describe(hints[name]) for name in names}}  # type: ignore[union-attr]
    if kind is Any:
        return "Any"
    return getattr(kind, "__qualname__", repr(kind))


def protocol() -> dict[str, Any]:
    """Every declared payload type, described: what ``tests/wire_protocol.json`` holds."""
    return {
        "items": {task: describe(kind) for task, kind in sorted(ITEMS.items())},
        "results": {task: describe(kind) for task, kind in sorted(RESULTS.items())},
        "generation": {name: describe(kind) for name, kind in GENERATION.items()},
        "calls": {op: [describe(args), describe(value)] for op, (args, value) in sorted(CALLS.items())},
        "error": describe(WireError),
        "errors": sorted(_declared_errors()),
    }
