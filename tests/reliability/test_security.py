"""Security: optional API keys, CORS off unless configured, request ids everywhere, no request text in logs."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from servers import LiveServer, ServiceProcess

from harness.ports import free_port
from service.api.http.auth import ApiKeys
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
