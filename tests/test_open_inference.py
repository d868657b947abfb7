"""Open Inference Protocol v2 (KServe v2 / Triton) end to end: the real ``tritonclient.http`` against a
real server on loopback, with its default settings (binary tensors both ways) and with JSON tensors.

Every model's v2 answer must equal its REST route's answer for the same input: both doors lead to the
same InferenceService. No mocks.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from litestar.testing import TestClient
from PIL import Image
from servers import LiveServer, burst_until_refused, small_queues
from tritonclient.utils import InferenceServerException

from model_export.profiles import MODEL_NAMES
from service.api.oip.tasks import NotOnV2Error, signature
from service.app import create_app
from service.inference import TaskContract
from service.settings import Settings

MODELS = set(MODEL_NAMES)  # every model the export builds
MAX_ITEMS = 8
FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_ITEMS=MAX_ITEMS, MAX_BODY_BYTES=2**20
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def rest(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(api: LiveServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(api.url.removeprefix("http://"), network_timeout=120)
    yield c
    c.close()


def ok(rest: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = rest.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def bytes_input(name: str, values: list[bytes], binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=object), binary_data=binary)
    return tensor


def infer(
    client: triton.InferenceServerClient,
    model: str,
    inputs: dict[str, list[bytes]],
    binary: bool,
    parameters: dict[str, Any] | None = None,
) -> triton.InferResult:
    """tritonclient's defaults (binary in, all outputs binary) or JSON both ways (every output asked as JSON)."""
    tensors = [bytes_input(name, values, binary) for name, values in inputs.items()]
    outputs = None
    if not binary:
        meta = client.get_model_metadata(model)
        outputs = [triton.InferRequestedOutput(o["name"], binary_data=False) for o in meta["outputs"]]
    return client.infer(model, tensors, outputs=outputs, parameters=parameters)


def texts(result: triton.InferResult, name: str) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy(name).reshape(-1)]


def png(seed: int) -> bytes:
    rng = random.Random(seed)
    image = Image.new("L", (28, 28))
    image.putdata([rng.randrange(256) for _ in range(28 * 28)])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


# --- health and metadata --------------------------------------------------------------------------


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "transformer-serving"
    assert {"binary_tensor_data", "generate"} <= set(meta["extensions"])


def test_model_metadata_ready_and_versions(client: triton.InferenceServerClient, rest: httpx.Client) -> None:
    versions = {m["name"]: m["version"] for m in rest.get("/v1/models").json()["models"]}
    assert set(versions) == MODELS
    for name, version in versions.items():
        meta = client.get_model_metadata(name)
        assert meta["name"] == name and meta["versions"] == [version]
        assert meta["platform"] == "onnxruntime_onnx"
        assert all(t["shape"][0] == -1 for t in meta["inputs"] + meta["outputs"])
        assert client.get_model_metadata(name, version) == meta
        assert client.is_model_ready(name) and client.is_model_ready(name, version)
        assert client.get_model_config(name)["name"] == name
    classifier = client.get_model_metadata("bert-classifier")
    assert classifier["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    labels = classifier["parameters"]["labels"]
    assert {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(labels)]} in classifier["outputs"]
    assert [t["name"] for t in client.get_model_metadata("bert-qa")["inputs"]] == ["question", "context"]
    assert "temperature" in client.get_model_metadata("gpt")["parameters"]["request_parameters"]

    index = client.get_model_repository_index()
    assert {m["name"] for m in index if m["state"] == "READY"} == MODELS


def test_unknown_models_and_versions_are_404(client: triton.InferenceServerClient) -> None:
    for call in (
        lambda: client.get_model_metadata("no-such-model"),
        lambda: client.get_model_metadata("gpt", "1"),
        lambda: client.infer("no-such-model", [bytes_input("text", [b"x"], True)]),
        lambda: client.infer("gpt", [bytes_input("prompt", [b"x"], True)], model_version="1"),
    ):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "404"
        assert "no-such-model" in info.value.message() or "version '1'" in info.value.message()
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("gpt", "1")


# --- infer on every model, binary and JSON, equal to the REST answer ------------------------------

BINARY = [pytest.param(True, id="binary"), pytest.param(False, id="json")]


@pytest.mark.parametrize("binary", BINARY)
def test_text_classification(client: triton.InferenceServerClient, rest: httpx.Client, binary: bool) -> None:
    sentences = ["a gorgeous, witty film", "dull and far too long", "fine"]
    result = infer(client, "bert-classifier", {"text": [s.encode() for s in sentences]}, binary)
    expected = ok(rest, "/v1/classify", {"texts": sentences, "top_k": 2})["results"]
    assert texts(result, "label") == [r["label"] for r in expected]
    assert result.as_numpy("score").tolist() == [np.float32(r["score"]) for r in expected]
    labels = client.get_model_metadata("bert-classifier")["parameters"]["labels"]
    probs = result.as_numpy("probabilities")
    assert probs.shape == (3, len(labels))
    for row, r in zip(probs, expected, strict=True):
        for top in r["labels"]:
            assert row[labels.index(top["label"])] == np.float32(top["score"])
    assert result.get_response()["model_version"] == ok(rest, "/v1/classify", {"text": "x"})["model_version"]


@pytest.mark.parametrize("binary", BINARY)
def test_image_classification(client: triton.InferenceServerClient, rest: httpx.Client, binary: bool) -> None:
    images = [png(1), png(2)]
    sent = images if binary else [base64.b64encode(i) for i in images]  # JSON BYTES are strings: base64
    result = infer(client, "vit", {"image": sent}, binary)
    expected = ok(rest, "/v1/classify", {"images": [base64.b64encode(i).decode() for i in images]})["results"]
    assert texts(result, "label") == [r["label"] for r in expected]
    assert result.as_numpy("score").tolist() == [np.float32(r["score"]) for r in expected]
    assert result.as_numpy("probabilities").sum(axis=1) == pytest.approx([1.0, 1.0], abs=1e-4)


@pytest.mark.parametrize("binary", BINARY)
def test_question_answering(client: triton.InferenceServerClient, rest: httpx.Client, binary: bool) -> None:
    pairs = [
        ("Who won?", "The Denver Broncos won Super Bowl 50 in Santa Clara."),
        ("Where was it?", "Super Bowl 50 was played at Levi's Stadium in Santa Clara, California."),
    ]
    inputs = {"question": [q.encode() for q, _ in pairs], "context": [c.encode() for _, c in pairs]}
    result = infer(client, "bert-qa", inputs, binary)
    items = [{"question": q, "context": c} for q, c in pairs]
    expected = ok(rest, "/v1/extract", {"task": "qa", "items": items})["results"]
    assert texts(result, "answer") == [r["answer"] for r in expected]
    assert result.as_numpy("start").tolist() == [r["start"] for r in expected]
    assert result.as_numpy("end").tolist() == [r["end"] for r in expected]
    assert result.as_numpy("start").dtype == np.int64
    assert result.as_numpy("score").tolist() == [np.float32(r["score"]) for r in expected]


@pytest.mark.parametrize("binary", BINARY)
def test_entities(client: triton.InferenceServerClient, rest: httpx.Client, binary: bool) -> None:
    sentences = ["Angela Merkel visited Paris with Emmanuel Macron.", "Nothing here."]
    result = infer(client, "bert-tagger", {"text": [s.encode() for s in sentences]}, binary)
    expected = ok(rest, "/v1/extract", {"task": "entities", "texts": sentences})["results"]
    assert [json.loads(e) for e in texts(result, "entities")] == [r["entities"] for r in expected]


@pytest.mark.parametrize("binary", BINARY)
def test_generation(client: triton.InferenceServerClient, rest: httpx.Client, binary: bool) -> None:
    prompts = ["ROMEO:\n", "KING:"]
    params = {"temperature": 0, "max_tokens": 12}
    result = infer(client, "gpt", {"prompt": [p.encode() for p in prompts]}, binary, params)
    expected = ok(rest, "/v1/generate", {"prompts": prompts, "temperature": 0, "max_new_tokens": 12})[
        "results"
    ]
    assert texts(result, "text") == [r["text"] for r in expected]
    assert texts(result, "finish_reason") == [r["finish_reason"] for r in expected]
    assert result.get_response()["parameters"]["output_tokens"] == sum(
        r["completion_tokens"] for r in expected
    )


@pytest.mark.parametrize("binary", BINARY)
def test_translation(client: triton.InferenceServerClient, rest: httpx.Client, binary: bool) -> None:
    sources = ["A man is riding a bicycle.", "Two dogs play in the snow."]
    result = infer(client, "translator", {"text": [s.encode() for s in sources]}, binary, {"beam_size": 2})
    expected = ok(rest, "/v1/translate", {"texts": sources, "beam_size": 2, "return_scores": True})["results"]
    assert texts(result, "translation") == [r["text"] for r in expected]
    assert result.as_numpy("score").tolist() == pytest.approx([r["score"] for r in expected], rel=1e-6)


@pytest.mark.parametrize("stop", ["e", '["e", "\\n"]'])
def test_generation_stop_strings(client: triton.InferenceServerClient, rest: httpx.Client, stop: str) -> None:
    """``stop`` is one string, or a JSON array of them (request parameters are scalars)."""
    params = {"temperature": 0, "max_tokens": 16, "stop": stop}
    result = infer(client, "gpt", {"prompt": [b"ROMEO:"]}, True, params)
    stops = json.loads(stop) if stop.startswith("[") else [stop]
    expected = ok(
        rest, "/v1/generate", {"prompt": "ROMEO:", "temperature": 0, "max_new_tokens": 16, "stop": stops}
    )
    assert texts(result, "text") == [expected["results"][0]["text"]]
    assert texts(result, "finish_reason") == [expected["results"][0]["finish_reason"]]


def test_requested_outputs_and_mixed_binary(client: triton.InferenceServerClient) -> None:
    outputs = [triton.InferRequestedOutput("start", binary_data=False), triton.InferRequestedOutput("answer")]
    tensors = [
        bytes_input("question", [b"Who won?"], True),
        bytes_input("context", [b"The Broncos won."], False),
    ]
    result = client.infer("bert-qa", tensors, outputs=outputs)
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["start", "answer"]
    assert "data" in response["outputs"][0] and "binary_data_size" in response["outputs"][1]["parameters"]
    assert result.as_numpy("answer").shape == (1,)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client: triton.InferenceServerClient, algorithm: str) -> None:
    """tritonclient's request_compression_algorithm: the body is inflated before it is read."""
    tensor = bytes_input("text", [b"great", b"awful"], True)
    plain = client.infer("bert-classifier", [tensor])
    squeezed = client.infer("bert-classifier", [tensor], request_compression_algorithm=algorithm)
    assert squeezed.as_numpy("score").tolist() == plain.as_numpy("score").tolist()


def test_batch_shape_minus_one_by_one(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("text", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"great"], [b"awful"]], dtype=object))
    assert client.infer("bert-classifier", [tensor]).as_numpy("label").shape == (2,)


# --- Triton's generate extension -------------------------------------------------------------------


def test_generate_extension_gpt_greedy_equals_v1(rest: httpx.Client) -> None:
    expected = ok(rest, "/v1/generate", {"prompt": "ROMEO:\n", "temperature": 0, "max_new_tokens": 16})
    # Triton passes top-level fields besides text_input as parameters too
    body = ok(
        rest,
        "/v2/models/gpt/generate",
        {"id": "42", "text_input": "ROMEO:\n", "temperature": 0, "max_tokens": 16},
    )
    assert body["text_output"] == expected["results"][0]["text"]
    assert (
        body["id"] == "42"
        and body["model_name"] == "gpt"
        and body["model_version"] == expected["model_version"]
    )
    versioned = f"/v2/models/gpt/versions/{expected['model_version']}/generate"
    again = ok(
        rest, versioned, {"text_input": "ROMEO:\n", "parameters": {"temperature": 0, "max_tokens": 16}}
    )
    assert again["text_output"] == body["text_output"] and "id" not in again

    chunks = []
    stream_body = {"text_input": "ROMEO:\n", "parameters": {"temperature": 0, "max_tokens": 16}}
    with rest.stream("POST", "/v2/models/gpt/generate_stream", json=stream_body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                chunks.append(json.loads(line[len("data:") :]))
    assert "".join(c["text_output"] for c in chunks) == body["text_output"]
    assert chunks[-1]["finish_reason"] == expected["results"][0]["finish_reason"]
    assert all(c["model_name"] == "gpt" for c in chunks)


def test_generate_extension_translator(rest: httpx.Client) -> None:
    expected = ok(rest, "/v1/translate", {"text": "A man is riding a bicycle."})["results"][0]
    body = ok(rest, "/v2/models/translator/generate", {"text_input": "A man is riding a bicycle."})
    assert body["text_output"] == expected["text"]
    with rest.stream(
        "POST", "/v2/models/translator/generate_stream", json={"text_input": "A man is riding a bicycle."}
    ) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert [c["text_output"] for c in chunks] == [expected["text"]]


def test_generate_extension_errors(rest: httpx.Client) -> None:
    r = rest.post("/v2/models/bert-classifier/generate", json={"text_input": "x"})
    assert r.status_code == 400 and "generate" in r.json()["error"]
    r = rest.post("/v2/models/gpt/generate", json={"text_input": "x", "temperature": 9})
    assert r.status_code == 400 and "parameters.temperature" in r.json()["error"]
    r = rest.post("/v2/models/gpt/generate_stream", json={"text_input": "x", "max_tokens": 10**6})
    assert r.status_code == 400 and "MAX_NEW_TOKENS" in r.json()["error"]
    # Triton's own curl examples send JSON with curl's default form type: the body is read as JSON anyway
    r = rest.post("/v2/models/gpt/generate", content=b'{"text_input": "x", "max_tokens": 2}', headers=FORM)
    assert r.status_code == 200 and r.json()["model_name"] == "gpt"
    r = rest.post("/v2/models/gpt/generate", content=b"text_input=x", headers=FORM)
    assert r.status_code == 400 and set(r.json()) == {"error"}
    assert rest.post("/v2/models/nope/generate", json={"text_input": "x"}).status_code == 404


# --- bad input: 400 {"error"} naming what is wrong, never a 5xx ------------------------------------


def test_bad_tensors_are_400_naming_the_input(client: triton.InferenceServerClient) -> None:
    cases: list[tuple[str, list[triton.InferInput], dict[str, Any] | None, str]] = []
    numbers = triton.InferInput("text", [1], "FP32")
    numbers.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    cases.append(("bert-classifier", [numbers], None, "'text' is FP32"))
    cases.append(("bert-classifier", [bytes_input("texts", [b"x"], True)], None, "no input 'texts'"))
    cases.append(("bert-qa", [bytes_input("question", [b"x"], True)], None, "needs input 'context'"))
    cases.append(("bert-classifier", [bytes_input("text", [b"  "], True)], None, "text[0]"))
    cases.append(("bert-classifier", [bytes_input("text", [b"\xff"], True)], None, "text[0]"))
    cases.append(
        ("bert-classifier", [bytes_input("text", [b"x"] * (MAX_ITEMS + 1), True)], None, "MAX_ITEMS")
    )
    cases.append(("bert-classifier", [bytes_input("text", [b"x"], True)], {"top_k": 3}, "parameters.top_k"))
    cases.append(("gpt", [bytes_input("prompt", [b"x"], True)], {"top_p": 0}, "parameters.top_p"))
    cases.append(
        ("translator", [bytes_input("text", [b"x"], True)], {"beam_size": 99}, "parameters.beam_size")
    )
    cases.append(("vit", [bytes_input("image", [b"\x89PNG not really"], True)], None, "image[0]"))
    pair = [bytes_input("question", [b"a", b"b"], True), bytes_input("context", [b"c"], True)]
    cases.append(("bert-qa", pair, None, "batch sizes"))
    for model, tensors, parameters, says in cases:
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, tensors, parameters=parameters)
        assert info.value.status() == "400", (model, says, info.value.message())
        assert says in info.value.message(), (model, says, info.value.message())


def test_malformed_binary_bodies_are_400(rest: httpx.Client) -> None:
    header = json.dumps(
        {
            "inputs": [
                {"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 9}}
            ]
        }
    ).encode()
    tensor = b"\x05\x00\x00\x00hello"
    url = "/v2/models/bert-classifier/infer"
    good = rest.post(
        url, content=header + tensor, headers={"Inference-Header-Content-Length": str(len(header))}
    )
    assert good.status_code == 200 and good.headers["content-type"] == "application/json"
    for body, length in [
        (header + tensor[:6], str(len(header))),  # truncated tensor
        (header + tensor, str(len(header) + 3)),  # header length inside the tensor
        (header + tensor, "999999"),  # past the body
        (header + tensor, "abc"),
        (header + tensor, None),  # binary data, no header length: not JSON
        (b"", None),
        (b'{"inputs": []}', None),
        (b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}', None),
        (b'{"inputs": [{"name": "text", "shape": "1", "datatype": "BYTES", "data": ["x"]}]}', None),
    ]:
        headers = {"Inference-Header-Content-Length": length} if length is not None else {}
        r = rest.post(url, content=body, headers=headers)
        assert r.status_code == 400, (body, length, r.text)
        assert set(r.json()) == {"error"} and r.json()["error"]
    too_big = rest.post(url, content=b"{" + b" " * 2**20 + b"}")
    assert too_big.status_code == 413 and set(too_big.json()) == {"error"}
    bomb = gzip.compress(b"{" + b" " * 2**21 + b"}")  # small on the wire, over MAX_BODY_BYTES inflated
    r = rest.post(url, content=bomb, headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and set(r.json()) == {"error"}
    for encoding, body in [("gzip", b"not gzip"), ("gzip", gzip.compress(header)[:-9]), ("br", header)]:
        r = rest.post(url, content=body, headers={"content-encoding": encoding})
        assert r.status_code == 400 and set(r.json()) == {"error"}, (encoding, r.text)


def test_middleware_answers_in_the_v2_shape(tiny_models: Path, tmp_path: Path) -> None:
    """Auth runs before any handler: on /v2 it still answers {"error": "..."}; /v2/health/ stays open."""
    empty = tmp_path / "models"
    empty.mkdir()
    app = create_app(Settings(MODEL_REPOSITORY=empty, API_KEYS=["k1"]))
    with TestClient(app) as c:
        r = c.get("/v2")
        assert r.status_code == 401 and set(r.json()) == {"error"}
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2", headers={"Authorization": "Bearer k1"}).status_code == 200
        r = c.get("/v2/health/ready")  # no model loaded: not ready
        assert r.status_code == 503 and r.json() == {"ready": False}


def test_full_queue_is_429_with_retry_after(tiny_models: Path) -> None:
    """The engine's own backpressure, in the protocol's shape: a queue of one and a burst of translations."""
    sentence = "A woman in a red dress sings on a stage in front of a large crowd of people."
    body = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [sentence]}],
        "parameters": {"beam_size": 4, "max_new_tokens": 60},
    }
    with LiveServer(small_queues(tiny_models)) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        for r in burst_until_refused(c, "/v2/models/translator/infer", body):
            assert set(r.json()) == {"error"} and "queue" in r.json()["error"]


def test_a_task_without_v2_tensors_is_a_404() -> None:
    """A model whose task's contract declares no tensors (a new task) is not there for v2 clients: 404, not 500."""
    model = SimpleNamespace(
        name="new-model",
        task="some-new-task",
        labels=[],
        manifest=SimpleNamespace(labels=None),
        contract=TaskContract("some-new-task", "new-model", (), ()),
    )
    with pytest.raises(NotOnV2Error, match="some-new-task"):
        signature(model)  # type: ignore[arg-type]
