"""The Open Inference Protocol's tensor codec (service/api/oip/tensors.py and its HTTP form, service/api/v2/tensors.py): round trips, tritonclient's own
encoding both ways, and every malformed body answered as a 400 naming the input (never a 5xx)."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from tritonclient.http import InferResult
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from service.api.oip.tensors import Output, decode_binary, encode_binary, encode_bytes_elements
from service.api.v2.tensors import decode_json, decompress, encode_response, read_inputs, split_body
from service.errors import MalformedBodyError


def spec(name: str, datatype: str, shape: list[int], size: int | None = None, data: Any = None) -> Any:
    """A stand-in for schemas.v2.RequestInput."""
    return SimpleNamespace(
        name=name,
        datatype=datatype,
        shape=shape,
        parameters={"binary_data_size": size} if size is not None else None,
        data=data,
    )


# --- round trips ----------------------------------------------------------------------------------


def test_bytes_elements_are_length_prefixed_little_endian() -> None:
    values = [b"a", b"", "Grüße".encode(), bytes(range(256))]
    raw = encode_bytes_elements(values)
    assert raw[:5] == struct.pack("<I", 1) + b"a"
    assert raw[5:9] == struct.pack("<I", 0)
    assert decode_binary("text", "BYTES", [4], raw).values == values
    assert decode_binary("text", "BYTES", [2, 2], raw).shape == (2, 2)


def test_bytes_match_tritonclient_both_ways() -> None:
    values = np.array([b"first", b"", b"\x00\xff third"], dtype=object)
    theirs = serialize_byte_tensor(values).item()
    assert decode_binary("x", "BYTES", [3], theirs).values == list(values)
    assert list(deserialize_bytes_tensor(encode_bytes_elements(list(values)))) == list(values)


@pytest.mark.parametrize(
    ("datatype", "values", "fmt"),
    [("FP32", [0.5, -1.25, 3.0e-8], "<3f"), ("INT64", [1, -2, 2**40], "<3q"), ("INT32", [7, -7, 0], "<3i")],
)
def test_numeric_tensors_are_little_endian_row_major(datatype: str, values: list[Any], fmt: str) -> None:
    raw = struct.pack(fmt, *values)
    tensor = decode_binary("x", datatype, [3], raw)
    assert np.asarray(tensor.values).tolist() == pytest.approx(values)
    assert encode_binary(Output("x", datatype, (3,), np.asarray(tensor.values))) == raw
    assert decode_json("x", datatype, [3, 1], [[v] for v in values]).shape == (3, 1)


def test_json_bytes_are_utf8_strings() -> None:
    assert decode_json("text", "BYTES", [2], ["Grüße", ""]).values == ["Grüße".encode(), b""]


def test_a_response_with_binary_outputs_reads_back_in_tritonclient() -> None:
    outputs = [
        (Output("label", "BYTES", (2,), [b"positive", b"negative"]), True),
        (Output("score", "FP32", (2,), np.array([0.75, 0.5], dtype=np.float32)), True),
        (Output("start", "INT64", (2,), np.array([3, 9], dtype=np.int64)), False),
    ]
    body, header_length = encode_response({"model_name": "m", "model_version": "1"}, outputs)
    assert header_length is not None
    header = json.loads(body[:header_length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 2 * 4 + 8 + 8}
    assert header["outputs"][2]["data"] == [3, 9]
    result = InferResult.from_response_body(body, header_length=header_length)
    assert list(result.as_numpy("label")) == [b"positive", b"negative"]
    assert result.as_numpy("score").tolist() == [0.75, 0.5]
    assert result.as_numpy("start").tolist() == [3, 9]


def test_a_json_only_response_has_no_header_length() -> None:
    body, header_length = encode_response({}, [(Output("text", "BYTES", (1,), [b"hi"]), False)])
    assert header_length is None
    assert json.loads(body)["outputs"] == [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}
    ]


def test_inputs_take_their_binary_data_in_order() -> None:
    header = {"inputs": []}
    text = encode_bytes_elements([b"q1", b"q2"])
    numbers = struct.pack("<2q", 4, 5)
    body = json.dumps(header).encode() + text + numbers
    parsed, binary = split_body(body, str(len(json.dumps(header))))
    assert parsed == header
    tensors = read_inputs(
        [
            spec("question", "BYTES", [2], len(text)),
            spec("json", "FP32", [1], data=[1.5]),
            spec("n", "INT64", [2], len(numbers)),
        ],
        binary,
    )
    assert tensors[0].values == [b"q1", b"q2"]
    assert np.asarray(tensors[1].values).tolist() == [1.5]
    assert np.asarray(tensors[2].values).tolist() == [4, 5]


# --- malformed input: a 400 naming the input ------------------------------------------------------


def bad(call: Any, *args: Any) -> MalformedBodyError:
    with pytest.raises(MalformedBodyError) as info:
        call(*args)
    return info.value


@pytest.mark.parametrize(
    ("raw", "shape", "says"),
    [
        (b"\x05\x00", [1], "truncated"),  # half a length
        (struct.pack("<I", 10) + b"abc", [1], "says 10 bytes"),  # an element past the end
        (encode_bytes_elements([b"a", b"b"]), [3], "holds 2 elements"),
        (encode_bytes_elements([b"a", b"b", b"c"]), [2], "holds 3+ elements"),
        (struct.pack("<I", 2**32 - 1), [1], "says 4294967295 bytes"),
    ],
)
def test_broken_bytes_tensors(raw: bytes, shape: list[int], says: str) -> None:
    err = bad(decode_binary, "text", "BYTES", shape, raw)
    assert err.field == "text" and "'text'" in err.message and says in err.message


@pytest.mark.parametrize(
    ("datatype", "shape", "raw", "says"),
    [
        ("FP32", [2], b"\x00" * 7, "needs 8"),
        ("INT64", [3, 1], b"\x00" * 16, "needs 24"),
        ("COMPLEX", [1], b"\x00", "unknown datatype"),
        ("FP32", [-1], b"", "non-negative"),
        ("FP32", "3", b"", "shape must be"),
        ("FP32", [1] * 9, b"", "at most 8"),
        ("FP32", [2**40, 2**40], b"\x00" * 4, "more than"),  # a huge shape is refused before any allocation
        ("FP32", [0, 10**20], b"", "more than"),  # no element, but no array could have this shape
        ("FP32", [0, 2**62, 8], b"", "more than"),
    ],
)
def test_broken_numeric_tensors(datatype: str, shape: Any, raw: bytes, says: str) -> None:
    assert says in bad(decode_binary, "x", datatype, shape, raw).message


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "says"),
    [
        ("BYTES", [2], ["one"], "holds 1 elements"),
        ("BYTES", [1], [3], "must be strings"),
        ("FP32", [1], ["0.5"], "FP32 values"),
        ("INT64", [1], [1.5], "INT64 values"),
        ("INT64", [1], [True], "INT64 values"),
        ("INT8", [1], [1000], "does not fit"),
        ("BOOL", [1], [1], "BOOL values"),
    ],
)
def test_broken_json_tensors(datatype: str, shape: list[int], data: Any, says: str) -> None:
    assert says in bad(decode_json, "x", datatype, shape, data).message


@pytest.mark.parametrize(
    ("body", "length", "says"),
    [
        (b'{"inputs": []}', "0", "raw binary request"),
        (b'{"inputs": []}', "99", "must be an integer"),
        (b'{"inputs": []}', "-3", "must be an integer"),
        (b'{"inputs": []}', "ten", "must be an integer"),
        (b'{"inputs": [}', None, "not valid JSON"),
        (b"\xff\xfe", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (b'{"a": 1}xyz', "5", "not valid JSON"),
        (b"[" * 100_000, None, "not valid JSON"),
    ],
)
def test_broken_bodies(body: bytes, length: str | None, says: str) -> None:
    assert says in bad(split_body, body, length).message


def test_binary_sizes_must_add_up_to_the_body() -> None:
    data = memoryview(encode_bytes_elements([b"abc"]))
    assert "runs past the body" in bad(read_inputs, [spec("text", "BYTES", [1], len(data) + 1)], data).message
    extra = memoryview(bytes(data) + b"zz")
    leftover = bad(read_inputs, [spec("text", "BYTES", [1], len(data))], extra)
    assert "2 bytes after the last binary input" in leftover.message
    both = spec("text", "BYTES", [1], len(data), data=["abc"])
    assert "both data and binary_data_size" in bad(read_inputs, [both], data).message
    assert "neither data nor" in bad(read_inputs, [spec("text", "BYTES", [1])], memoryview(b"")).message
    negative = spec("text", "BYTES", [1], -1)
    assert "non-negative integer" in bad(read_inputs, [negative], data).message


def test_compressed_bodies_inflate_within_the_limit() -> None:
    body = b'{"inputs": []}'
    assert decompress(gzip.compress(body), "gzip", 100) == body
    assert decompress(zlib.compress(body), "deflate", 100) == body  # tritonclient's deflate: zlib's format
    assert decompress(body, None, 100) == body and decompress(body, "identity", 100) == body
    with pytest.raises(RequestEntityTooLarge):
        decompress(gzip.compress(b" " * 10_000), "gzip", 100)
    assert "not supported" in bad(decompress, body, "br", 100).message
    assert "not valid gzip" in bad(decompress, b"plain", "gzip", 100).message
    assert "truncated" in bad(decompress, gzip.compress(body)[:-10], "gzip", 100).message
