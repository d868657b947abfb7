"""The Open Inference Protocol's tensors, whatever carries them: the datatypes, a decoded tensor, and
the binary form both transports share (the HTTP binary tensor extension's buffers, gRPC's
``raw_input_contents`` and ``raw_output_contents``).

Binary tensors are little-endian, row major, without padding; a ``BYTES``
element is a 4-byte little-endian unsigned length followed by that many bytes.
Everything a client can get wrong here (a truncated buffer, an element count
that does not fit the shape, an unknown datatype, a value its datatype cannot
hold) is a ``MalformedBodyError`` (400) naming the input: never a 5xx.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.errors import MalformedBodyError

# datatype -> numpy dtype (little-endian); BYTES has none: its elements are byte strings.
NUMERIC: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
DATATYPES = (*NUMERIC, "BYTES")
MAX_DIMS = 8
MAX_ELEMENTS = 2**31 - 1  # far past any body MAX_BODY_BYTES admits; numpy's own limit is near 2**63
_LENGTH = struct.Struct("<I")


def bad(name: str, message: str) -> MalformedBodyError:
    return MalformedBodyError(f"input {name!r}: {message}", "bad_request", field=name)


@dataclass(frozen=True)
class Tensor:
    """One decoded tensor: ``values`` is a numpy array, or for BYTES a flat list of byte strings."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray | Sequence[bytes]

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1


def element_count(name: str, shape: Any) -> int:
    """The number of elements of ``shape``; a shape that is not a short list of non-negative ints, or that
    no array could have, is a 400.

    Every path that makes an array (JSON ``data``, binary data, gRPC contents) counts through here first,
    so numpy never meets a shape it refuses: ``[0, 10**20]`` holds no element, but numpy cannot make an
    array of it (nor of ``[0, 2**62, 8]``, whose other axes overflow its size), so the product of the
    non-zero axes is bounded too."""
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise bad(name, f"shape must be a list of at most {MAX_DIMS} non-negative integers")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise bad(name, f"shape {list(shape)} must hold non-negative integers")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise bad(name, f"shape {list(shape)} describes more than {MAX_ELEMENTS} elements along its axes")
    return math.prod(shape)


def decode_bytes_elements(name: str, raw: bytes | memoryview, count: int) -> list[bytes]:
    """``count`` length-prefixed elements filling ``raw`` exactly."""
    out: list[bytes] = []
    offset = 0
    view = memoryview(raw)
    while offset < len(view):
        if offset + 4 > len(view):
            raise bad(name, f"BYTES data is truncated: an element's 4-byte length starts at byte {offset}")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise bad(name, f"BYTES element {len(out)} says {length} bytes; only {len(view) - offset} left")
        out.append(bytes(view[offset : offset + length]))
        offset += length
        if len(out) > count:
            break
    if len(out) != count:
        raise bad(
            name, f"BYTES data holds {len(out)}{'+' if len(out) > count else ''} elements; shape says {count}"
        )
    return out


def decode_binary(name: str, datatype: str, shape: Sequence[int], raw: bytes | memoryview) -> Tensor:
    """A tensor from its binary form (``raw`` is exactly its ``binary_data_size`` bytes)."""
    count = element_count(name, shape)
    if datatype == "BYTES":
        return Tensor(name, datatype, tuple(shape), decode_bytes_elements(name, raw, count))
    dtype = NUMERIC.get(datatype)
    if dtype is None:
        raise bad(name, f"unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    if len(raw) != count * dtype.itemsize:
        raise bad(
            name,
            f"{len(raw)} bytes of binary data; shape {list(shape)} of {datatype} needs {count * dtype.itemsize}",
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(tuple(shape))
    return Tensor(name, datatype, tuple(shape), array)


def numeric_tensor(name: str, datatype: str, shape: Sequence[int], values: Sequence[Any]) -> Tensor:
    """A numeric tensor from its values (counted against ``shape`` already): a value its datatype cannot
    hold (300 as INT8, -1 as UINT32) is a 400, as every other mistake in the data."""
    try:
        array = np.array(values, dtype=NUMERIC[datatype]).reshape(tuple(shape))
    except (OverflowError, ValueError) as exc:
        raise bad(name, f"data does not fit {datatype}: {exc}") from exc
    return Tensor(name, datatype, tuple(shape), array)


# --- outputs --------------------------------------------------------------------------------------


Output = Tensor
"""A result tensor: numeric values as a numpy array of the datatype, BYTES as byte strings (row major)."""


def encode_bytes_elements(values: Sequence[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(v)) + v for v in values)


def encode_binary(output: Output) -> bytes:
    if output.datatype == "BYTES":
        return encode_bytes_elements(list(output.values))  # type: ignore[arg-type]
    array = np.ascontiguousarray(output.values, dtype=NUMERIC[output.datatype])
    return array.tobytes()
