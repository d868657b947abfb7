"""The Open Inference Protocol's tensors on HTTP: JSON ``data`` and the binary tensor data extension.

A v2 ``infer`` body is a JSON header, optionally followed by raw tensor bytes
(``Inference-Header-Content-Length`` gives the header's length; each binary
input says its ``binary_data_size``, in input order), in the binary form of
``oip/tensors.py``.

Everything a client can get wrong here (a header length past the body, a
truncated buffer, JSON data that does not fit the shape) is a
``MalformedBodyError`` (400) naming the input: never a 5xx.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from service.api.http.client_json import parse_client_json
from service.api.oip.tensors import (
    DATATYPES,
    NUMERIC,
    Output,
    Tensor,
    bad,
    decode_binary,
    element_count,
    encode_binary,
    numeric_tensor,
)
from service.errors import MalformedBodyError


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
        raise bad(name, f"data holds {len(flat)} elements; shape {list(shape)} says {count}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise bad(name, "BYTES data must be strings in JSON (send other bytes as binary data)")
        return Tensor(name, datatype, tuple(shape), [v.encode("utf-8", "surrogatepass") for v in flat])
    dtype = NUMERIC.get(datatype)
    if dtype is None:
        raise bad(name, f"unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    wanted: type | tuple[type, ...] = (
        bool if datatype == "BOOL" else (int, float) if dtype.kind == "f" else int
    )
    if not all(isinstance(v, wanted) and (datatype == "BOOL" or not isinstance(v, bool)) for v in flat):
        raise bad(name, f"data must hold {datatype} values")
    return numeric_tensor(name, datatype, shape, flat)


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
                raise bad(item.name, "has neither data nor a binary_data_size parameter")
            tensors.append(decode_json(item.name, item.datatype, item.shape, item.data))
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(item.name, "binary_data_size must be a non-negative integer")
        if item.data is not None:
            raise bad(item.name, "has both data and binary_data_size")
        if offset + size > len(binary):
            raise bad(
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
