"""Small ONNX graphs written as protobuf bytes, without the ``onnx`` package (an export-only dependency).

The engine needs a few tiny graphs of its own, made for a model's KV layout at load time: moving KV-cache
rows between device buffers (``device_kv.py``) runs them on the decoder's own execution provider, so the
rows never cross to the host. ONNX Runtime loads a model from bytes; this writes the handful of ModelProto
fields such graphs use (nodes with int and ints attributes, typed inputs and outputs with symbolic or fixed
dimensions, int64 initializers), field numbers as in onnx.proto3. ``tests/test_device_kv.py`` parses what
it writes with the ``onnx`` package and checks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

IR_VERSION = 8  # what ONNX Runtime 1.14+ reads; opset 17 below
OPSET = 17
# TensorProto.DataType
FLOAT, INT64, INT32, FLOAT16 = 1, 7, 6, 10
ELEMENT_TYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.float16): FLOAT16, np.dtype(np.int64): INT64}
ELEMENT_TYPES[np.dtype(np.int32)] = INT32


def element_type(dtype: np.dtype | type) -> int:
    return ELEMENT_TYPES[np.dtype(dtype)]


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64 as two's complement, as protobuf does
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _int(number: int, value: int) -> bytes:
    return _key(number, 0) + _varint(value)


def _bytes(number: int, value: bytes) -> bytes:
    return _key(number, 2) + _varint(len(value)) + value


def _str(number: int, value: str) -> bytes:
    return _bytes(number, value.encode())


@dataclass(frozen=True)
class Node:
    op_type: str
    inputs: Sequence[str]
    outputs: Sequence[str]
    ints: dict[str, int] = field(default_factory=dict)  # attributes of type INT
    int_lists: dict[str, Sequence[int]] = field(default_factory=dict)  # attributes of type INTS

    def encode(self, name: str) -> bytes:
        out = b"".join(_str(1, i) for i in self.inputs) + b"".join(_str(2, o) for o in self.outputs)
        out += _str(3, name) + _str(4, self.op_type)
        for key, value in self.ints.items():  # AttributeProto: name 1, i 3, type 20 (INT = 2)
            out += _bytes(5, _str(1, key) + _int(3, value) + _int(20, 2))
        for key, values in self.int_lists.items():  # ints 8 (unpacked), type INTS = 7
            out += _bytes(5, _str(1, key) + b"".join(_int(8, v) for v in values) + _int(20, 7))
        return out


Dim = int | str  # a fixed size or a symbolic name


@dataclass(frozen=True)
class Value:
    name: str
    dtype: np.dtype | type
    shape: Sequence[Dim]

    def encode(self) -> bytes:
        dims = b"".join(
            _bytes(1, _int(1, d) if isinstance(d, int) else _str(2, d)) for d in self.shape
        )  # TensorShapeProto.Dimension: dim_value 1, dim_param 2
        tensor = _int(1, element_type(self.dtype)) + _bytes(2, dims)  # TypeProto.Tensor
        return _str(1, self.name) + _bytes(2, _bytes(1, tensor))  # ValueInfoProto: name 1, type 2


def _initializer(name: str, values: Sequence[int]) -> bytes:
    """An int64 1-D TensorProto: dims 1, data_type 2, int64_data 7 (packed), name 8."""
    packed = b"".join(_varint(v) for v in values)
    return _int(1, len(values)) + _int(2, INT64) + _bytes(7, packed) + _str(8, name)


def model_bytes(
    name: str,
    nodes: Sequence[Node],
    inputs: Sequence[Value],
    outputs: Sequence[Value],
    initializers: Mapping[str, Sequence[int]] | None = None,
) -> bytes:
    """A ModelProto (ir_version 1, opset_import 8, producer_name 2, graph 7) of one GraphProto (node 1, name 2,
    initializer 5, input 11, output 12)."""
    graph = b"".join(_bytes(1, node.encode(f"{node.op_type}_{i}")) for i, node in enumerate(nodes))
    graph += _str(2, name)
    for key, values in (initializers or {}).items():
        graph += _bytes(5, _initializer(key, values))
    graph += b"".join(_bytes(11, v.encode()) for v in inputs)
    graph += b"".join(_bytes(12, v.encode()) for v in outputs)
    opset = _str(1, "") + _int(2, OPSET)  # OperatorSetIdProto: domain 1, version 2
    return _int(1, IR_VERSION) + _str(2, "transformer-serving") + _bytes(7, graph) + _bytes(8, opset)
