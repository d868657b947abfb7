"""The gRPC messages' tensors <-> the v2 door's ``Tensor`` and ``Output``.

Inputs come as ``raw_input_contents`` (what ``tritonclient.grpc`` sends: one raw buffer per input,
in input order, laid out as the HTTP binary extension's) or as typed ``contents``; outputs always go
as ``raw_output_contents``. Parameters are ``InferParameter`` oneofs, read as plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from service.api.oip.tensors import (
    Output,
    Tensor,
    decode_binary,
    element_count,
    encode_binary,
    numeric_tensor,
)
from service.errors import MalformedBodyError

# datatype -> the InferTensorContents field that holds it (FP16 and BF16: raw only)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_value(parameter: pb.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def parameters_of(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    return {name: parameter_value(p) for name, p in parameters.items()}


def set_parameter(parameters: Any, name: str, value: Any) -> None:
    """``parameters[name] = value`` in the oneof that fits the value's type."""
    if isinstance(value, bool):
        parameters[name].bool_param = value
    elif isinstance(value, int):
        parameters[name].int64_param = value
    elif isinstance(value, float):
        parameters[name].double_param = value
    else:
        parameters[name].string_param = str(value)


def read_inputs(request: pb.ModelInferRequest) -> list[Tensor]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise MalformedBodyError(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: give one per input or none",
            field="raw_input_contents",
        )
    tensors = []
    for i, tensor in enumerate(request.inputs):
        shape = list(tensor.shape)
        if raw:
            tensors.append(decode_binary(tensor.name, tensor.datatype, shape, raw[i]))
            continue
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
            raise MalformedBodyError(
                f"input {tensor.name!r}: {tensor.datatype} goes in raw_input_contents", field=tensor.name
            )
        values = list(getattr(tensor.contents, field))
        if len(values) != element_count(tensor.name, shape):
            raise MalformedBodyError(
                f"input {tensor.name!r}: contents hold {len(values)} elements; shape {shape} says "
                f"{element_count(tensor.name, shape)}",
                field=tensor.name,
            )
        if tensor.datatype == "BYTES":
            tensors.append(Tensor(tensor.name, "BYTES", tuple(shape), [bytes(v) for v in values]))
        else:
            tensors.append(numeric_tensor(tensor.name, tensor.datatype, shape, values))
    return tensors


def add_output(response: pb.ModelInferResponse, output: Output) -> None:
    tensor = response.outputs.add()
    tensor.name = output.name
    tensor.datatype = output.datatype
    tensor.shape.extend(int(d) for d in output.shape)
    response.raw_output_contents.append(encode_binary(output))
