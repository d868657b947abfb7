"""Inputs that once reached a 500 (HTTP) or INTERNAL (gRPC), each now a 4xx or INVALID_ARGUMENT naming its field.

- a v2 ``stop`` string nested past the JSON decoder's depth;
- tensor shapes numpy cannot make (``[0, 10**20]``, ``[0, 2**62, 8]``), on the JSON, binary and gRPC paths,
  and shapes of booleans or floats;
- values a tensor's datatype cannot hold, in gRPC's typed contents;
- NaN sampling and decoding parameters over gRPC (JSON cannot carry NaN);
- booleans where a number is expected, in every JSON door.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from servers import LiveServer
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from harness.ports import free_port
from service.api.http.body_model import NoBooleanNumbers
from service.api.openai.embeddings import EmbeddingsRequest
from service.api.openai.schemas import CompletionRequest
from service.api.rest.schemas.classify import ClassifyRequest
from service.api.rest.schemas.extract import ExtractRequest
from service.api.rest.schemas.generate import GenerateRequest
from service.api.rest.schemas.translate import TranslateRequest
from service.settings import Settings


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    port = free_port()
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, GRPC_PORT=port)
    with LiveServer(settings) as server:
        server.grpc_url = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def stub(api: LiveServer) -> Iterator[rpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(api.grpc_url) as channel:  # type: ignore[attr-defined]
        yield rpc.GRPCInferenceServiceStub(channel)


def _grpc_error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# --- a stop string nested too deeply ----------------------------------------------------------------


def test_a_deeply_nested_stop_string_is_a_4xx_on_http_and_grpc(
    api: LiveServer, stub: rpc.GRPCInferenceServiceStub
) -> None:
    nested = "[" * 5000
    response = httpx.post(
        f"{api.url}/v2/models/gpt/generate",
        json={"text_input": "hi", "parameters": {"stop": nested}},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert "stop" in response.json()["error"]

    request = pb.ModelInferRequest(model_name="gpt")
    tensor = request.inputs.add(name="prompt", datatype="BYTES")
    tensor.shape.append(1)
    request.raw_input_contents.append(struct.pack("<I", 2) + b"hi")
    request.parameters["stop"].string_param = nested
    error = _grpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "stop" in str(error.details())
    # a stop string that is valid JSON, or merely starts with '[', still works as before
    for stop in ('["\\n", "."]', "[not json"):
        ok = httpx.post(
            f"{api.url}/v2/models/gpt/generate",
            json={"text_input": "hi", "parameters": {"stop": stop, "max_tokens": 4}},
            timeout=30,
        )
        assert ok.status_code == 200, ok.text


# --- shapes numpy cannot make -------------------------------------------------------------------------

BAD_SHAPES: list[list[Any]] = [[0, 10**20], [0, 2**62, 8]]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=str)
def test_an_unmakeable_shape_is_a_400_on_the_json_and_binary_paths(api: LiveServer, shape: list[int]) -> None:
    json_body = {"inputs": [{"name": "text", "shape": shape, "datatype": "BYTES", "data": []}]}
    response = httpx.post(f"{api.url}/v2/models/bert-classifier/infer", json=json_body, timeout=30)
    assert response.status_code == 400, response.text
    assert "'text'" in response.json()["error"]

    # binary numeric data (the datatype is checked against the model's only after decoding)
    header = json.dumps(
        {
            "inputs": [
                {"name": "text", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": 0}}
            ]
        }
    ).encode()
    response = httpx.post(
        f"{api.url}/v2/models/bert-classifier/infer",
        content=header,
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert "'text'" in response.json()["error"]


@pytest.mark.parametrize("shape", [[0, 2**63 - 1], [0, 2**62, 8]], ids=str)  # gRPC shapes are int64
@pytest.mark.parametrize("path", ["raw", "contents"])
def test_an_unmakeable_shape_is_invalid_argument_on_grpc(
    stub: rpc.GRPCInferenceServiceStub, shape: list[int], path: str
) -> None:
    request = pb.ModelInferRequest(model_name="bert-classifier")
    tensor = request.inputs.add(name="text", datatype="FP32")
    tensor.shape.extend(shape)
    if path == "raw":
        request.raw_input_contents.append(b"")
    error = _grpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "'text'" in str(error.details())


@pytest.mark.parametrize("dim", [True, 1.0, 2.5, -1])
def test_a_shape_of_booleans_or_floats_is_refused(api: LiveServer, dim: Any) -> None:
    body = {"inputs": [{"name": "text", "shape": [dim], "datatype": "BYTES", "data": ["a fine film"]}]}
    response = httpx.post(f"{api.url}/v2/models/bert-classifier/infer", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "shape" in response.json()["error"]


def test_a_value_its_datatype_cannot_hold_is_invalid_argument(stub: rpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name="bert-classifier")
    tensor = request.inputs.add(name="text", datatype="INT8")
    tensor.shape.append(1)
    tensor.contents.int_contents.append(300)
    error = _grpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "INT8" in str(error.details())


# --- NaN parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("gpt", "temperature"),
        ("gpt", "top_p"),
        ("gpt", "repetition_penalty"),
        ("translator", "length_penalty"),
    ],
)
def test_nan_parameters_are_invalid_argument(
    stub: rpc.GRPCInferenceServiceStub, model: str, name: str
) -> None:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="prompt" if model == "gpt" else "text", datatype="BYTES")
    tensor.shape.append(1)
    request.raw_input_contents.append(struct.pack("<I", 2) + b"hi")
    request.parameters[name].double_param = math.nan
    error = _grpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert f"parameters.{name}" in str(error.details()) and "nan" in str(error.details())


# --- booleans are not numbers -------------------------------------------------------------------------


def _body_models() -> list[type[NoBooleanNumbers]]:
    """Every JSON body model of every door (each derives from NoBooleanNumbers), found by walking them."""
    found: list[type[NoBooleanNumbers]] = []
    todo = list(NoBooleanNumbers.__subclasses__())
    while todo:
        model = todo.pop()
        found.append(model)
        todo += model.__subclasses__()
    return sorted(set(found), key=lambda m: m.__name__)


def test_every_number_field_of_every_json_body_refuses_a_boolean() -> None:
    """Walks each body model's fields: every field that takes numbers (and not booleans) refuses true."""
    models = _body_models()
    assert {ClassifyRequest, ExtractRequest, GenerateRequest, TranslateRequest, CompletionRequest} <= set(
        models
    )
    assert EmbeddingsRequest in models
    checked = 0
    for model in models:
        for name in model._number_fields():
            with pytest.raises(ValueError) as info:
                model.model_validate({name: True})
            errors = info.value.errors()  # type: ignore[attr-defined]
            assert errors[0]["type"] == "bool_is_not_a_number" and errors[0]["ctx"]["field"] == name
            checked += 1
    assert checked >= 15, checked


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": True}, "max_new_tokens"),
        ("/v1/translate", {"text": "hi", "beam_size": True}, "beam_size"),
        ("/v1/classify", {"text": "hi", "top_k": False}, "top_k"),
        ("/v1/completions", {"model": "gpt", "prompt": "hi", "max_tokens": True}, "max_tokens"),
        ("/v2/models/gpt/generate", {"text_input": "hi", "parameters": {"max_tokens": True}}, "max_tokens"),
    ],
)
def test_a_boolean_for_a_number_is_a_4xx_naming_the_field(
    api: LiveServer, path: str, body: dict[str, Any], field: str
) -> None:
    response = httpx.post(f"{api.url}{path}", json=body, timeout=30)
    assert response.status_code in (400, 422), response.text
    assert field in response.text
