"""The error vocabulary: the core says what an error is once, every door renders that, and nothing else.

``service/errors.py`` classifies (a kind, its HTTP status and gRPC code, the field, when to retry); the
doors only shape it: REST's ``{"error": {...}}``, OpenAI's, the Open Inference Protocol's, gRPC's
status, and a middleware's raw answer in the shape of the door whose path it is. No server here: the
same renderers the servers use, on each kind of error (the served answers are tests/test_api.py's,
test_openai.py's, test_open_inference.py's and test_grpc.py's).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from litestar.datastructures import State

from service.api.grpc.errors import status_of
from service.api.http.error_body import error_body
from service.api.http.raw_errors import RAW_SHAPES_KEY, send_error
from service.api.openai.errors import openai_error_body
from service.api.routes import RAW_ERROR_SHAPES
from service.api.v2.errors import v2_error_body
from service.errors import (
    KINDS,
    ClientDisconnectedError,
    InvalidInputError,
    MalformedBodyError,
    ModelNotFoundError,
    NotReadyError,
    Problem,
    UnsupportedMediaTypeError,
    problem_of,
)
from service.inference import (
    BatcherClosedError,
    EngineError,
    GenerationCancelledError,
    QueueFullError,
    QueueTimeoutError,
)


def test_every_kind_has_a_grpc_code_and_an_http_status() -> None:
    for kind, spec in KINDS.items():
        assert isinstance(getattr(grpc.StatusCode, spec.grpc), grpc.StatusCode), kind
        assert 400 <= spec.status < 600, kind


@pytest.mark.parametrize(
    ("exc", "kind", "status", "code", "retry"),
    [
        (
            InvalidInputError("too long", "texts[2]", "too_long"),
            "validation_error",
            422,
            "INVALID_ARGUMENT",
            None,
        ),
        (MalformedBodyError("not JSON", "malformed_json"), "malformed_json", 400, "INVALID_ARGUMENT", None),
        (
            UnsupportedMediaTypeError("text/plain", "application/json"),
            "unsupported_media_type",
            415,
            "INVALID_ARGUMENT",
            None,
        ),
        (ModelNotFoundError("nope", ["gpt"]), "model_not_found", 404, "NOT_FOUND", None),
        (NotReadyError("starting", 3), "not_ready", 503, "UNAVAILABLE", 3),
        (QueueFullError("gpt", 64, 0), "queue_full", 429, "RESOURCE_EXHAUSTED", 1),  # never Retry-After: 0
        (QueueTimeoutError("gpt", 30.0), "queue_timeout", 503, "UNAVAILABLE", 1),
        (BatcherClosedError("gpt"), "unavailable", 503, "UNAVAILABLE", 1),
        (GenerationCancelledError("gone"), "cancelled", 499, "CANCELLED", None),
        (ClientDisconnectedError(), "client_closed_request", 499, "CANCELLED", None),
        (EngineError("onnxruntime raised"), "internal_error", 500, "INTERNAL", None),
        (KeyError("a bug"), "internal_error", 500, "INTERNAL", None),
    ],
)
def test_the_core_classifies_each_error_once(
    exc: BaseException, kind: str, status: int, code: str, retry: int | None
) -> None:
    problem = problem_of(exc)
    assert (problem.kind, problem.status, problem.grpc, problem.retry_after_s) == (kind, status, code, retry)
    grpc_code, _ = status_of(exc)
    assert grpc_code == getattr(grpc.StatusCode, code)
    if status == 500:  # a bug's words stay in the log
        assert "see the service log" in problem.message and "onnxruntime" not in problem.message


def test_each_door_renders_the_same_problem_in_its_shape() -> None:
    problem = problem_of(InvalidInputError("must not be empty", "texts[0]", "blank_text"))
    rest = error_body(problem, "req-1").model_dump(exclude_none=True)["error"]
    assert rest == {
        "type": "validation_error",
        "message": "texts[0]: must not be empty",
        "field": "texts[0]",
        "request_id": "req-1",
        "errors": [{"field": "texts[0]", "message": "must not be empty", "type": "blank_text"}],
    }
    openai = openai_error_body(problem)["error"]
    assert openai == {
        "message": "texts[0]: must not be empty",
        "type": "invalid_request_error",  # OpenAI's word for a 400: validation errors are 400s there
        "param": "texts[0]",
        "code": "validation_error",
    }
    assert v2_error_body(problem) == {"error": "texts[0]: must not be empty"}
    assert status_of(InvalidInputError("must not be empty", "texts[0]"))[1] == "texts[0]: must not be empty"
    missing = problem_of(ModelNotFoundError("nope", ["gpt"]))  # the field beside the message, not in it
    assert error_body(missing, None).error.message == "model 'nope' is not loaded (loaded: gpt)"
    assert (
        status_of(ModelNotFoundError("nope", ["gpt"]))[1] == "model: model 'nope' is not loaded (loaded: gpt)"
    )


class _App:
    state = State({RAW_SHAPES_KEY: RAW_ERROR_SHAPES})


def _raw(path: str, problem: Problem) -> tuple[int, dict[str, str], dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope: Any = {"type": "http", "path": path, "app": _App(), "state": {}}
    asyncio.run(send_error(scope, send, problem))
    start, body = sent
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body["body"])


def test_a_middleware_answers_in_the_shape_of_the_door_whose_path_it_is() -> None:
    problem = Problem("overloaded", "busy; retry later", retry_after_s=1)
    for path, shape in [
        ("/v1/classify", {"error": {"type": "overloaded", "message": "busy; retry later"}}),
        (
            "/v1/completions",
            {
                "error": {
                    "message": "busy; retry later",
                    "type": "server_error",
                    "param": None,
                    "code": "overloaded",
                }
            },
        ),
        ("/v2/models/gpt/infer", {"error": "busy; retry later"}),
    ]:
        status, headers, body = _raw(path, problem)
        assert (status, headers["retry-after"], body) == (503, "1", shape), path
    challenge = (("WWW-Authenticate", 'Bearer realm="tserve"'),)
    status, headers, body = _raw(
        "/v1/embeddings", Problem("unauthorized", "key?", "Authorization", headers=challenge)
    )
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert body["error"]["type"] == "authentication_error" and body["error"]["param"] == "Authorization"


def test_one_image_decoder_for_every_door() -> None:
    """REST's base64 strings and v2's BYTES (JSON strings, or raw bytes over binary and gRPC) meet one
    decoder, with one size refusal before decoding and one reason for what is not an image's bytes."""
    import base64

    from service.inference import image_bytes

    png = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
    text = base64.b64encode(png).decode()
    assert image_bytes("image", text, 10_000) == png
    assert image_bytes("image", "data:image/png;base64," + text[:40] + "\n" + text[40:], 10_000) == png
    assert image_bytes("image[0]", png, 10_000) == png  # raw bytes pass as they are
    assert image_bytes("image[0]", text.encode(), 10_000) == png  # ASCII bytes are base64
    for value, field, reason in [
        (text, "images[2]", "too_large"),
        ("not base64!", "image", "undecodable_image"),
        ("data:image/png,raw", "image", "undecodable_image"),
    ]:
        with pytest.raises(InvalidInputError) as info:
            image_bytes(field, value, 100)
        assert (info.value.field, info.value.reason) == (field, reason)
