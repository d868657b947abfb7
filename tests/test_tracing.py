"""Traces (service/tracing.py) exported to a real OTLP/gRPC receiver on loopback (tests/otlp.py): the
caller's W3C trace is continued, the sampler is obeyed, and a receiver that is down fails nothing."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from otlp import OtlpReceiver
from servers import LiveServer

from harness.ports import free_port
from service.settings import Settings
from service.tracing import DEFAULT_SERVICE_NAME, resource_from_environment, tracing_configured

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER


def _settings(tiny_models: Path) -> Settings:
    return Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["bert-classifier"], CACHE_ENABLED=False)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def _trace_to(monkeypatch: pytest.MonkeyPatch, endpoint: str, **extra: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # ms: spans leave soon after they end
    monkeypatch.setenv("OTEL_SERVICE_NAME", "serving-under-test")
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def test_traces_are_off_unless_an_otlp_endpoint_is_set() -> None:
    assert not tracing_configured({})
    assert tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert not tracing_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}
    )
    assert not tracing_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}
    )


def test_the_service_name_comes_from_otel_service_name_then_the_resource_attributes_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert resource_from_environment().attributes["service.name"] == DEFAULT_SERVICE_NAME
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,deployment.environment=test")
    resource = resource_from_environment()
    assert resource.attributes["service.name"] == "from-attributes"
    assert resource.attributes["deployment.environment"] == "test"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-service-name")
    assert resource_from_environment().attributes["service.name"] == "from-service-name"


def test_a_request_continues_the_callers_trace_with_a_server_span_named_by_its_route(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with LiveServer(_settings(tiny_models)) as server:
        r = httpx.post(
            f"{server.url}/v1/classify",
            json={"text": "a fine film"},
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=kept"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        spans = receiver.wait_for(trace_id, "POST /v1/classify")
    (span,) = [s for s in spans if s.name == "POST /v1/classify"]
    assert span.span.kind == SERVER
    assert span.parent_span_id == parent_id  # the caller's span is its parent: one trace
    assert span.span.trace_state == "vendor=kept"
    attributes = span.attributes
    assert attributes["http.route"] == "/v1/classify"
    assert attributes.get("http.response.status_code", attributes.get("http.status_code")) == 200
    assert span.resource["service.name"] == "serving-under-test"


def test_with_the_sampler_off_nothing_is_exported(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint, OTEL_TRACES_SAMPLER="always_off")
    with LiveServer(_settings(tiny_models)) as server:
        for _ in range(3):
            r = httpx.post(f"{server.url}/v1/classify", json={"text": "unseen"}, timeout=30)
            assert r.status_code == 200, r.text
    # The server's shutdown flushed its exporter: whatever it had would have been sent by now.
    assert receiver.spans == []


def test_a_receiver_that_is_down_fails_no_request(tiny_models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _trace_to(monkeypatch, f"http://127.0.0.1:{free_port()}", OTEL_EXPORTER_OTLP_TIMEOUT="1000")
    with LiveServer(_settings(tiny_models)) as server:
        for i in range(5):
            r = httpx.post(
                f"{server.url}/v1/classify",
                json={"text": f"nobody collects this {i}"},
                headers={"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
