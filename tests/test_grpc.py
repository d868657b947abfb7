"""Open Inference Protocol v2 over gRPC end to end: NVIDIA's ``tritonclient.grpc`` as it is, against a real
server on loopback whose HTTP and gRPC doors share one process, one event loop and one inference core.

Every model's gRPC answer must equal the HTTP v2 door's answer (``tritonclient.http``) for the same
tensors: the same core, batchers and cache answer both. No mocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from servers import LiveServer, metric
from test_open_inference import png
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc
from tritonclient.utils import InferenceServerException

from harness.ports import free_port
from model_export.profiles import MODEL_NAMES
from service.settings import Settings

MODELS = set(MODEL_NAMES)  # every model the export builds


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    port = free_port()
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_ITEMS=8, GRPC_PORT=port)
    with LiveServer(settings) as server:
        server.grpc_url = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def grpc_client(api: LiveServer) -> Iterator[tgrpc.InferenceServerClient]:
    client = tgrpc.InferenceServerClient(api.grpc_url)  # type: ignore[attr-defined]
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(api: LiveServer) -> Iterator[thttp.InferenceServerClient]:
    client = thttp.InferenceServerClient(api.url.removeprefix("http://"), network_timeout=120)
    yield client
    client.close()


# Each model's input tensors (BYTES, one element per item) and request parameters.
REQUESTS: dict[str, tuple[dict[str, list[bytes]], dict[str, Any]]] = {
    "translator": ({"text": [b"A man is riding a bicycle.", b"Two dogs play."]}, {"max_new_tokens": 8}),
    "bert-classifier": ({"text": [b"a wonderful film", b"dull and long"]}, {}),
    "bert-qa": (
        {"question": [b"Who lives in Paris?"], "context": [b"Marie lives in Paris with her cat."]},
        {},
    ),
    "bert-tagger": ({"text": [b"Ada Lovelace lived in London."]}, {}),
    "bert-embedder": ({"text": [b"a sentence", b"another one"]}, {}),
    "bert-reranker": (
        {"query": [b"who plays?", b"who plays?"], "document": [b"a guitar player", b"rates rose"]},
        {},
    ),
    "gpt": ({"prompt": [b"ROMEO:", b"JULIET:"]}, {"max_tokens": 6, "temperature": 0.0}),
    "vit": ({"image": [png(1), png(2)]}, {}),
}


def _inputs(module: Any, tensors: dict[str, list[bytes]]) -> list[Any]:
    out = []
    for name, values in tensors.items():
        tensor = module.InferInput(name, [len(values)], "BYTES")
        tensor.set_data_from_numpy(np.array(values, dtype=object))
        out.append(tensor)
    return out


def _outputs(result: Any, names: list[str]) -> dict[str, np.ndarray]:
    return {name: result.as_numpy(name) for name in names}


def test_health_and_server_metadata(grpc_client: tgrpc.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    meta = grpc_client.get_server_metadata(as_json=True)
    assert meta["name"] == "transformer-serving"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_equals_the_http_door(
    grpc_client: tgrpc.InferenceServerClient, http_client: thttp.InferenceServerClient
) -> None:
    for name in MODELS:
        over_http = http_client.get_model_metadata(name)
        over_grpc = grpc_client.get_model_metadata(name, as_json=True)
        assert over_grpc["name"] == name and over_grpc["versions"] == over_http["versions"]
        assert over_grpc["platform"] == "onnxruntime_onnx"
        for side in ("inputs", "outputs"):
            assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in over_grpc[side]] == [
                (t["name"], t["datatype"], t["shape"]) for t in over_http[side]
            ]
        assert grpc_client.is_model_ready(name)
        assert grpc_client.is_model_ready(name, over_http["versions"][0])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_answers_as_over_http(
    model: str, grpc_client: tgrpc.InferenceServerClient, http_client: thttp.InferenceServerClient
) -> None:
    tensors, parameters = REQUESTS[model]
    names = [o["name"] for o in http_client.get_model_metadata(model)["outputs"]]
    over_http = http_client.infer(model, _inputs(thttp, tensors), parameters=parameters or None)
    over_grpc = grpc_client.infer(model, _inputs(tgrpc, tensors), parameters=parameters or None)
    expected, got = _outputs(over_http, names), _outputs(over_grpc, names)
    for name in names:
        assert got[name].shape == expected[name].shape, (model, name)
        if got[name].dtype == object:
            assert got[name].tolist() == expected[name].tolist(), (model, name)
        else:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    response = over_grpc.get_response()
    assert response.model_name == model
    assert response.parameters["input_tokens"].int64_param > 0


def test_requested_outputs_come_in_the_order_asked(grpc_client: tgrpc.InferenceServerClient) -> None:
    tensors, _ = REQUESTS["bert-classifier"]
    outputs = [tgrpc.InferRequestedOutput("score"), tgrpc.InferRequestedOutput("label")]
    result = grpc_client.infer("bert-classifier", _inputs(tgrpc, tensors), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["score", "label"]
    assert result.as_numpy("score").dtype == np.float32 and result.as_numpy("score").shape == (2,)


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_unknown_models_are_not_found(grpc_client: tgrpc.InferenceServerClient) -> None:
    text = _inputs(tgrpc, {"text": [b"x"]})
    for call in (
        lambda: grpc_client.infer("no-such-model", text),
        lambda: grpc_client.get_model_metadata("no-such-model"),
        lambda: grpc_client.is_model_ready("no-such-model"),
        lambda: grpc_client.infer("bert-classifier", text, model_version="1"),
    ):
        error = _error(call)
        assert error.status() == "StatusCode.NOT_FOUND", error.message()


def test_bad_tensors_are_invalid_argument_naming_the_input(grpc_client: tgrpc.InferenceServerClient) -> None:
    numbers = tgrpc.InferInput("text", [1], "FP32")
    numbers.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    cases: list[tuple[str, list[Any], dict[str, Any] | None, str]] = [
        ("bert-classifier", [numbers], None, "'text' is FP32"),
        ("bert-classifier", _inputs(tgrpc, {"texts": [b"x"]}), None, "no input 'texts'"),
        ("bert-qa", _inputs(tgrpc, {"question": [b"x"]}), None, "needs input 'context'"),
        ("bert-classifier", _inputs(tgrpc, {"text": [b"  "]}), None, "text[0]"),
        ("bert-classifier", _inputs(tgrpc, {"text": [b"\xff"]}), None, "text[0]"),
        ("bert-classifier", _inputs(tgrpc, {"text": [b"x"] * 9}), None, "MAX_ITEMS"),
        ("bert-classifier", _inputs(tgrpc, {"text": [b"x"]}), {"top_k": 3}, "parameters.top_k"),
        ("gpt", _inputs(tgrpc, {"prompt": [b"x"]}), {"top_p": 0.0}, "parameters.top_p"),
        ("gpt", _inputs(tgrpc, {"prompt": [b"x"]}), {"max_tokens": 10**6}, "MAX_NEW_TOKENS"),
        ("translator", _inputs(tgrpc, {"text": [b"x"]}), {"beam_size": 99}, "parameters.beam_size"),
        ("vit", _inputs(tgrpc, {"image": [b"\x89PNG not really"]}), None, "image[0]"),
    ]
    for model, tensors, parameters, says in cases:
        error = _error(lambda: grpc_client.infer(model, tensors, parameters=parameters))  # noqa: B023
        assert error.status() == "StatusCode.INVALID_ARGUMENT", (model, says, error.message())
        assert says in error.message(), (model, says, error.message())


def test_a_truncated_raw_tensor_is_invalid_argument(
    api: LiveServer, grpc_client: tgrpc.InferenceServerClient
) -> None:
    """A raw BYTES buffer whose length prefix runs past its end: the door says so, the server lives on."""
    grpc_url = api.grpc_url  # type: ignore[attr-defined]

    request = pb.ModelInferRequest(model_name="bert-classifier")
    tensor = request.inputs.add(name="text", datatype="BYTES")
    tensor.shape.append(1)
    request.raw_input_contents.append(b"\x05\x00\x00\x00hi")
    with grpc.insecure_channel(grpc_url) as channel:
        stub = rpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'text'" in str(info.value.details())
    assert grpc_client.is_server_ready()


def test_api_keys_guard_the_grpc_door_as_http(tiny_models: Path) -> None:
    """With API_KEYS, inference and metadata need a key in the call's metadata (Bearer or x-api-key), as on
    HTTP; the health RPCs stay open (AUTH_HEALTH is off)."""
    port = free_port()
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, GRPC_PORT=port, API_KEYS=["k1", "k2"], WARMUP=False
    )
    with LiveServer(settings):
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        text = _inputs(tgrpc, {"text": [b"a fine film"]})
        assert client.is_server_live()
        for headers, says in ((None, "a valid API key is required"), ({"x-api-key": "nope"}, "not valid")):
            error = _error(lambda: client.infer("bert-classifier", text, headers=headers))  # noqa: B023
            assert error.status() == "StatusCode.UNAUTHENTICATED" and says in error.message()
        assert _error(lambda: client.get_model_metadata("gpt")).status() == "StatusCode.UNAUTHENTICATED"
        for headers in ({"authorization": "Bearer k1"}, {"x-api-key": "k2"}):
            result = client.infer("bert-classifier", text, headers=headers)
            assert result.as_numpy("label").shape == (1,)
        client.close()


def test_grpc_calls_are_counted_in_the_metrics(
    api: LiveServer, grpc_client: tgrpc.InferenceServerClient
) -> None:
    """gRPC calls have their own request metrics beside HTTP's, labelled by RPC, model and status code."""
    labels = {"method": "ModelInfer", "model": "bert-embedder"}
    ok_before = metric(api.url, "tserve_grpc_requests_total", code="OK", **labels)
    bad_before = metric(api.url, "tserve_grpc_requests_total", code="INVALID_ARGUMENT", **labels)
    grpc_client.infer("bert-embedder", _inputs(tgrpc, {"text": [b"counted"]}))
    _error(lambda: grpc_client.infer("bert-embedder", _inputs(tgrpc, {"text": [b" "]})))
    assert metric(api.url, "tserve_grpc_requests_total", code="OK", **labels) == ok_before + 1
    assert metric(api.url, "tserve_grpc_requests_total", code="INVALID_ARGUMENT", **labels) == bad_before + 1
    assert metric(api.url, "tserve_grpc_request_duration_seconds_count", code="OK", **labels) == ok_before + 1
    assert metric(api.url, "tserve_grpc_requests_in_flight", method="ModelInfer") == 0
