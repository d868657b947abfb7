"""The Open Inference Protocol's tensors on the wire: JSON ``data`` and the binary tensor data extension.

A v2 ``infer`` body is a JSON header, optionally followed by raw tensor bytes
(``Inference-Header-Content-Length`` gives the header's length; each binary
input says its ``binary_data_size``, in input order). Binary tensors are
little-endian, row major, without padding; a ``BYTES`` element is a 4-byte
little-endian unsigned length followed by that many bytes.

Everything a client can get wrong here (a header length past the body, a
truncated buffer, an element count that does not fit the shape, an unknown
datatype) is a ``MalformedBodyError`` (400) naming the input: never a 5xx.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from service.api.http.client_json import parse_client_json
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


def _bad(name: str, message: str) -> MalformedBodyError:
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
        raise _bad(name, f"shape must be a list of at most {MAX_DIMS} non-negative integers")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise _bad(name, f"shape {list(shape)} must hold non-negative integers")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise _bad(name, f"shape {list(shape)} describes more than {MAX_ELEMENTS} elements along its axes")
    return math.prod(shape)


def decode_bytes_elements(name: str, raw: bytes | memoryview, count: int) -> list[bytes]:
    """``count`` length-prefixed elements filling ``raw`` exactly."""
    out: list[bytes] = []
    offset = 0
    view = memoryview(raw)
    while offset < len(view):
        if offset + 4 > len(view):
            raise _bad(name, f"BYTES data is truncated: an element's 4-byte length starts at byte {offset}")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise _bad(name, f"BYTES element {len(out)} says {length} bytes; only {len(view) - offset} left")
        out.append(bytes(view[offset : offset + length]))
        offset += length
        if len(out) > count:
            break
    if len(out) != count:
        raise _bad(
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
        raise _bad(name, f"unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    if len(raw) != count * dtype.itemsize:
        raise _bad(
            name,
            f"{len(raw)} bytes of binary data; shape {list(shape)} of {datatype} needs {count * dtype.itemsize}",
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(tuple(shape))
    return Tensor(name, datatype, tuple(shape), array)


def _flatten(node: Any, out: list[Any]) -> None:
    if isinstance(node, list):
        for item in node:
            _flatten(item, out)
    else:
        out.append(node)


def decode_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> Tensor:
    """A tensor from JSON ``data``: flat or nested row-major lists; BYTES elements are strings."""
    count = element_count(name, shape)
    flat: list[Any] = []
    _flatten(data, flat)
    if len(flat) != count:
        raise _bad(name, f"data holds {len(flat)} elements; shape {list(shape)} says {count}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise _bad(name, "BYTES data must be strings in JSON (send other bytes as binary data)")
        return Tensor(name, datatype, tuple(shape), [v.encode("utf-8", "surrogatepass") for v in flat])
    dtype = NUMERIC.get(datatype)
    if dtype is None:
        raise _bad(name, f"unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    wanted: type | tuple[type, ...] = (
        bool if datatype == "BOOL" else (int, float) if dtype.kind == "f" else int
    )
    if not all(isinstance(v, wanted) and (datatype == "BOOL" or not isinstance(v, bool)) for v in flat):
        raise _bad(name, f"data must hold {datatype} values")
    return numeric_tensor(name, datatype, shape, flat)


def numeric_tensor(name: str, datatype: str, shape: Sequence[int], values: Sequence[Any]) -> Tensor:
    """A numeric tensor from its values (counted against ``shape`` already): a value its datatype cannot
    hold (300 as INT8, -1 as UINT32) is a 400, as every other mistake in the data."""
    try:
        array = np.array(values, dtype=NUMERIC[datatype]).reshape(tuple(shape))
    except (OverflowError, ValueError) as exc:
        raise _bad(name, f"data does not fit {datatype}: {exc}") from exc
    return Tensor(name, datatype, tuple(shape), array)


# --- the whole body -------------------------------------------------------------------------------


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body as sent before ``Content-Encoding`` (tritonclient's ``request_compression_algorithm``:
    gzip, or deflate in zlib's format), at most ``limit`` bytes once inflated (else 413)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise MalformedBodyError(
            f"Content-Encoding {encoding!r} is not supported (gzip, deflate)", field="Content-Encoding"
        )
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise MalformedBodyError(
            f"the body is not valid {encoding}: {exc}", field="Content-Encoding"
        ) from exc
    if len(out) > limit:
        raise RequestEntityTooLarge(
            detail="request body is over the size limit (MAX_BODY_BYTES) once inflated"
        )
    if not inflater.eof:
        raise MalformedBodyError(f"the body is truncated {encoding} data", field="Content-Encoding")
    return out


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """(JSON header, the binary data after it); without ``Inference-Header-Content-Length`` all is JSON."""
    if header_length is None:
        json_part, rest = body, memoryview(b"")
    else:
        try:
            length = int(header_length.strip())
        except ValueError:
            length = -1
        if length == 0:
            raise MalformedBodyError(
                "Inference-Header-Content-Length 0 (a raw binary request without a JSON header) is not "
                "supported: send the JSON inference header",
                field="Inference-Header-Content-Length",
            )
        if not 0 < length <= len(body):
            raise MalformedBodyError(
                f"Inference-Header-Content-Length {header_length!r} must be an integer in 1..{len(body)} "
                "(the body's length)",
                field="Inference-Header-Content-Length",
            )
        json_part, rest = body[:length], memoryview(body)[length:]
    header = parse_client_json(json_part, "the inference header")
    if not isinstance(header, dict):
        raise MalformedBodyError("the inference header must be a JSON object", "malformed_json")
    return header, rest


def read_inputs(inputs: Sequence[Any], binary: memoryview) -> list[Tensor]:
    """Every input of a request (``RequestInput`` schemas), its binary data taken from ``binary`` in order."""
    tensors: list[Tensor] = []
    offset = 0
    for item in inputs:
        size = item.parameters.get("binary_data_size") if item.parameters else None
        if size is None:
            if item.data is None:
                raise _bad(item.name, "has neither data nor a binary_data_size parameter")
            tensors.append(decode_json(item.name, item.datatype, item.shape, item.data))
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _bad(item.name, "binary_data_size must be a non-negative integer")
        if item.data is not None:
            raise _bad(item.name, "has both data and binary_data_size")
        if offset + size > len(binary):
            raise _bad(
                item.name,
                f"binary_data_size {size} runs past the body: {len(binary) - offset} bytes of binary data left",
            )
        tensors.append(decode_binary(item.name, item.datatype, item.shape, binary[offset : offset + size]))
        offset += size
    if offset != len(binary):
        raise MalformedBodyError(
            f"{len(binary) - offset} bytes after the last binary input (binary_data_size values add up to "
            f"{offset})",
            field="Inference-Header-Content-Length",
        )
    return tensors


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


def json_data(output: Output) -> list[Any]:
    """The flat JSON ``data`` of an output (BYTES as UTF-8 strings: every text output here is text)."""
    if output.datatype == "BYTES":
        return [v.decode("utf-8") for v in output.values]  # type: ignore[union-attr]
    return np.asarray(output.values, dtype=NUMERIC[output.datatype]).reshape(-1).tolist()  # type: ignore[no-any-return]


def encode_response(
    header: dict[str, Any], outputs: Sequence[tuple[Output, bool]]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when any output is binary (else None).

    ``outputs`` pairs each output with whether it goes as binary data; ``header`` gets ``outputs``.
    """
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for output, binary in outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if binary:
            blob = encode_binary(output)
            blobs.append(blob)
            entry["parameters"] = {"binary_data_size": len(blob)}
        else:
            entry["data"] = json_data(output)
        described.append(entry)
    json_part = msgspec.json.encode({**header, "outputs": described})
    if not blobs:
        return json_part, None
    return json_part + b"".join(blobs), len(json_part)
