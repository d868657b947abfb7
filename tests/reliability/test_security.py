"""Security: optional API keys (one table on both doors), CORS off unless configured, request ids everywhere,
no request text in logs and no log line a client can forge, readiness without host paths, and the
response cache scoped per key."""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import message_factory
from servers import LiveServer, ServiceProcess
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from harness.ports import free_port
from service.access.keys import ApiKeys
from service.engine.repository import without_paths
from service.observe.logs import LOG_FORMAT, LogLineFormatter
from service.settings import Settings

KEYS = ["k-first-0123456789", "k-second-9876543210"]


def test_keys_are_compared_against_every_key() -> None:
    keys = ApiKeys(KEYS, protect_health=False, protect_metrics=True)
    assert keys.accepts(KEYS[0].encode()) and keys.accepts(KEYS[1].encode())
    assert not keys.accepts(b"k-first") and not keys.accepts(KEYS[0].encode() + b"x")
    assert keys.is_open("/health/ready") and keys.is_open("/schema/openapi.json")
    assert not keys.is_open("/metrics") and not keys.is_open("/v1/classify")
    assert not ApiKeys([], False, False).enabled


def test_api_keys(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, API_KEYS=KEYS, AUTH_METRICS=True)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"text": "a fine film"}
        missing = client.post("/v1/classify", json=body, headers={"X-Request-ID": "auth-1"})
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert missing.headers["x-request-id"] == "auth-1"
        error = missing.json()["error"]
        assert (error["type"], error["field"], error["request_id"]) == (
            "unauthorized",
            "Authorization",
            "auth-1",
        )
        wrong = client.post("/v1/classify", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]["message"]
        assert client.post(
            "/v1/classify", json=body, headers={"Authorization": f"Bearer {KEYS[1]}"}
        ).is_success
        assert client.post("/v1/classify", json=body, headers={"X-API-Key": KEYS[0]}).is_success
        assert client.get("/v1/models").status_code == 401
        # Probes stay open by default; /metrics is protected here (AUTH_METRICS).
        assert client.get("/health/ready").status_code == 200
        assert client.get("/health/live").status_code == 200
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"X-API-Key": KEYS[0]}).status_code == 200
        # The schema says so.
        schema = client.get("/schema/openapi.json").json()
        assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
        assert "401" in schema["paths"]["/v1/classify"]["post"]["responses"]
        assert "401" in schema["paths"]["/metrics"]["get"]["responses"]
        assert "401" not in schema["paths"]["/health/ready"]["get"]["responses"]


def test_health_can_be_protected_too(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, API_KEYS=KEYS, AUTH_HEALTH=True)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/health/ready").status_code == 401
        assert client.get("/health/ready", headers={"X-API-Key": KEYS[1]}).status_code == 200
        assert client.get("/metrics").status_code == 200  # AUTH_METRICS is off


def preflight(client: httpx.Client, origin: str) -> httpx.Response:
    return client.options(
        "/v1/classify",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-api-key",
        },
    )


def test_cors_is_off_by_default(tiny_models: Path) -> None:
    with (
        LiveServer(Settings(MODEL_REPOSITORY=tiny_models)) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        r = client.post("/v1/classify", json={"text": "fine"}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in preflight(client, "https://evil.example").headers


def test_cors_when_configured(tiny_models: Path) -> None:
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, CORS_ALLOW_ORIGINS=["https://app.example"], API_KEYS=KEYS
    )
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        allowed = preflight(client, "https://app.example")  # no key: preflights carry no credentials
        assert allowed.status_code in (200, 204)
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-api-key" in allowed.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-origin" not in preflight(client, "https://evil.example").headers
        r = client.post(
            "/v1/classify",
            json={"text": "fine"},
            headers={"Origin": "https://app.example", "X-API-Key": KEYS[0]},
        )
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()


SECRET = "zebra-quokka-7731"


@pytest.mark.parametrize("level", ["info"])
def test_logs_carry_ids_sizes_and_timings_but_no_request_text(
    tiny_models: Path, tmp_path: Path, level: str
) -> None:
    env = {"MODEL_REPOSITORY": str(tiny_models), "LOG_LEVEL": level}
    with (
        ServiceProcess(free_port(), env, tmp_path / "service.log") as service,
        httpx.Client(base_url=service.url, timeout=60) as client,
    ):
        calls = [
            ("/v1/classify", {"text": f"{SECRET} film"}),
            ("/v1/translate", {"text": f"A {SECRET} runs.", "max_new_tokens": 8}),
            ("/v1/generate", {"prompt": SECRET, "max_new_tokens": 4, "temperature": 0}),
            (
                "/v1/extract",
                {"task": "qa", "question": f"Who is {SECRET}?", "context": f"{SECRET} is here."},
            ),
            ("/v1/extract", {"task": "entities", "text": f"{SECRET} lives in Berlin."}),
            ("/v1/classify", {"text": f"{SECRET} " * 2000}),  # 422: too long
            ("/v1/classify", {"text": SECRET, "bogus": SECRET}),  # 422: unknown field
            ("/v1/translate", {"text": SECRET, "model": "bert-classifier"}),  # 422: task mismatch
        ]
        for i, (path, body) in enumerate(calls):
            r = client.post(path, json=body, headers={"X-Request-ID": f"log-{i}"})
            assert r.status_code in (200, 422), r.text
            assert r.headers["x-request-id"] == f"log-{i}"
        with client.stream(
            "POST", "/v1/generate", json={"prompt": SECRET, "max_new_tokens": 4, "stream": True}
        ) as r:
            r.read()
    log = service.log()
    assert SECRET not in log
    for i, (path, _) in enumerate(calls):
        # One access line per request: id, route, status, sizes, seconds.
        line = next(line for line in log.splitlines() if f"[log-{i} " in line and "service.access" in line)
        assert path in line and "in=" in line and "out=" in line and line.rstrip().endswith("s")


@pytest.mark.parametrize("enabled", [True, False])
def test_access_log_setting_controls_the_only_access_log(
    tiny_models: Path, tmp_path: Path, enabled: bool
) -> None:
    """ACCESS_LOG=true: one service.access line per request; false: none. uvicorn's own never appears."""
    env = {"MODEL_REPOSITORY": str(tiny_models), "LOG_LEVEL": "info", "ACCESS_LOG": str(enabled).lower()}
    with ServiceProcess(free_port(), env, tmp_path / "service.log") as service:
        for i in range(3):
            r = httpx.get(f"{service.url}/v1/models", headers={"X-Request-ID": f"acc-{i}"}, timeout=30)
            assert r.status_code == 200
        # The access line is written after the response goes out: read the log while the process
        # lives, giving the last line time to land (and, when disabled, time to wrongly appear).
        deadline = time.monotonic() + (10 if enabled else 1.5)
        while time.monotonic() < deadline and service.log().count("[acc-") < (3 if enabled else 1):
            time.sleep(0.1)
        log = service.log()
    ours = [line for line in log.splitlines() if "service.access" in line and "[acc-" in line]
    assert len(ours) == (3 if enabled else 0), log[-2000:]
    # uvicorn's access line looks like: 127.0.0.1:PORT - "GET /v1/models HTTP/1.1" 200
    assert '"GET /v1/models HTTP/1.1"' not in log, log[-2000:]


# --- log lines a client cannot forge -------------------------------------------------------------------

FORGED = "2099-01-01 00:00:00,000 CRITICAL service: forged"


def test_a_log_record_stays_one_line_whatever_it_holds() -> None:
    """The formatter escapes control characters in the message and the request fields, and indents a
    traceback: every line in column 0 is a record the formatter began."""
    formatter = LogLineFormatter(LOG_FORMAT)
    record = logging.LogRecord("service", logging.ERROR, __file__, 1, "bad id %s", (f"x\n{FORGED}\r",), None)
    record.request_id, record.model = f"id\n{FORGED}", "m\x1b[31m"
    try:
        raise ValueError(f"client text\n{FORGED}")
    except ValueError:
        record.exc_info = sys.exc_info()
    lines = formatter.format(record).splitlines()
    assert lines[0].count(FORGED) == 2 and "\\n" in lines[0] and "\\x1b" in lines[0]
    assert len(lines) > 1 and all(line.startswith("    ") for line in lines[1:])
    assert not any(line.startswith(FORGED) for line in lines)


def test_client_ids_follow_one_rule_on_both_doors(tiny_models: Path, tmp_path: Path) -> None:
    """HTTP's X-Request-ID and gRPC's request id: kept when sane, else replaced in the logs; a forged
    line never appears as a line of its own."""
    grpc_port = free_port()
    env = {"MODEL_REPOSITORY": str(tiny_models), "LOG_LEVEL": "info", "GRPC_PORT": str(grpc_port)}
    with ServiceProcess(free_port(), env, tmp_path / "service.log") as service:
        request = pb.ModelInferRequest(model_name="bert-classifier", id=f"evil\n{FORGED}")
        tensor = request.inputs.add(name="text", datatype="BYTES")
        tensor.shape.append(1)
        tensor.contents.bytes_contents.append(b"a fine film")
        sane = pb.ModelInferRequest()
        sane.CopyFrom(request)
        sane.id = "grpc-sane-1"
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = rpc.GRPCInferenceServiceStub(channel)
            assert stub.ModelInfer(request, timeout=60).id == request.id  # the protocol echoes it as sent
            stub.ModelInfer(sane, timeout=60)
        bad = httpx.get(f"{service.url}/v1/models", headers={"X-Request-ID": "a b" * 100}, timeout=30)
        assert bad.headers["x-request-id"] != "a b" * 100
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "[grpc-sane-1 " not in service.log():
            time.sleep(0.1)
        log = service.log()
    assert "[grpc-sane-1 bert-classifier]" in log and "gRPC ModelInfer OK" in log
    assert not any(line.startswith("2099") for line in log.splitlines())
    assert "evil" not in log  # the insane id was replaced, not escaped into the log


# --- one key table on both doors -------------------------------------------------------------------------


def _route_paths(app: Any) -> list[tuple[str, str]]:
    """(method, a concrete path) for every route the app serves, path parameters filled in."""
    out = []
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", lambda m: {"model_version": "1"}.get(m.group(1), "gpt"), route.path)
        for method in sorted(getattr(route, "methods", ()) or ()):
            if method not in ("HEAD", "OPTIONS"):
                out.append((method, path))
    return out


def _grpc_methods() -> list[Any]:
    return list(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods)


def _call_rpc(channel: grpc.Channel, method: Any, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    kwargs = {
        "request_serializer": request_class.SerializeToString,
        "response_deserializer": response_class.FromString,
    }
    try:
        if method.client_streaming:
            call = channel.stream_stream(path, **kwargs)
            for _ in call(iter([request_class()]), metadata=metadata, timeout=30):
                pass
        else:
            channel.unary_unary(path, **kwargs)(request_class(), metadata=metadata, timeout=30)
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize("auth_health", [False, True])
def test_every_route_and_rpc_follows_the_one_key_table(tiny_models: Path, auth_health: bool) -> None:
    """Walks every HTTP route and every gRPC method without a key: each answers 401 / UNAUTHENTICATED
    unless the table (api/http/auth.py) leaves it open, and each open one is open on both doors."""
    grpc_port = free_port()
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        API_KEYS=KEYS,
        AUTH_HEALTH=auth_health,
        GRPC_PORT=grpc_port,
        WARMUP=False,
    )
    keys = ApiKeys(KEYS, auth_health, False)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        routes = _route_paths(server.app)
        assert len(routes) > 20
        for method, path in routes:
            status = client.request(method, path).status_code
            if keys.is_open(path):
                assert status != 401, (method, path)
            else:
                assert status == 401, (method, path, status)
        assert (client.get("/health/ready").status_code == 401) == auth_health
        assert client.get("/v2").status_code == 401  # server metadata needs a key, as gRPC's does

        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            methods = _grpc_methods()
            assert len(methods) > 10
            for method in methods:
                code = _call_rpc(channel, method, [])
                if keys.rpc_is_open(method.name):
                    assert code != grpc.StatusCode.UNAUTHENTICATED, method.name
                else:
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (method.name, code)
                keyed = _call_rpc(channel, method, [("x-api-key", KEYS[0])])
                assert keyed != grpc.StatusCode.UNAUTHENTICATED, method.name
            open_rpcs = {m.name for m in methods if keys.rpc_is_open(m.name)}
            assert open_rpcs == (set() if auth_health else {"ServerLive", "ServerReady"})


# --- readiness without the host's layout ---------------------------------------------------------------


def test_readiness_names_a_missing_repository_without_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "models"
    with LiveServer(Settings(MODEL_REPOSITORY=missing)) as server:
        ready = httpx.get(f"{server.url}/health/ready", timeout=30)
    assert ready.status_code == 503
    assert "MODEL_REPOSITORY" in ready.text and "does not exist" in ready.text
    assert str(tmp_path) not in ready.text and "nowhere" not in ready.text


def test_refusal_reasons_shown_to_callers_hold_no_host_path() -> None:
    root = Path("/srv/secret-layout/models")
    assert (
        without_paths(f"cannot open {root}/bert/model.onnx", root)
        == "cannot open MODEL_REPOSITORY/bert/model.onnx"
    )
    assert (
        without_paths("Load model from /opt/x/y/model.onnx failed") == "Load model from .../model.onnx failed"
    )
    assert without_paths("2/3 graphs, ratio 1/2") == "2/3 graphs, ratio 1/2"


# --- the response cache per key ------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["key", "shared"])
def test_the_response_cache_is_scoped_per_key_unless_shared(tiny_models: Path, scope: str) -> None:
    """CACHE_SCOPE=key (the default): a hit never tells one key what another sent; shared: it may."""
    settings = Settings(MODEL_REPOSITORY=tiny_models, API_KEYS=KEYS, CACHE_SCOPE=scope, WARMUP=False)
    body = {"text": "a private sentence"}
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as client:

        def cached(key: str) -> bool:
            response = client.post("/v1/classify", json=body, headers={"X-API-Key": key})
            assert response.status_code == 200, response.text
            return bool(response.json()["cached"])

        assert not cached(KEYS[0])
        assert cached(KEYS[1]) == (scope == "shared")
        assert cached(KEYS[0])  # a key's own repeat is a hit either way
