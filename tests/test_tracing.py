"""Traces (service/observe/tracing.py, service/observe/spans.py) exported to real OTLP receivers on loopback (harness/otlp.py):
the caller's W3C trace is continued on both doors, through the core to the queue and the batch that served
it; a batch's span links every request it served; a stream's spans end with it; the sampler is obeyed; and
a receiver that is down fails nothing and is counted."""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from prometheus_client.openmetrics import parser as openmetrics
from servers import LiveServer, metric

from harness.otlp import OtlpHttpReceiver, OtlpReceiver, ReceivedSpan
from harness.ports import free_port
from harness.service_process import ServiceProcess
from service.observe import spans
from service.observe.tracing import (
    DEFAULT_SERVICE_NAME,
    protocol_from_environment,
    resource_from_environment,
    tracing_configured,
)
from service.settings import Settings

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER


def _settings(tiny_models: Path) -> Settings:
    return Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["bert-classifier"], CACHE_ENABLED=False)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def _traceparent() -> tuple[str, str, dict[str, str]]:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent_id, {"traceparent": f"00-{trace_id}-{parent_id}-01"}


def _one(spans_: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (found,) = [s for s in spans_ if s.name == name]
    return found


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


DROPPED = "tserve_trace_spans_dropped_total"


def _traced_classify(url: str, text: str) -> None:
    """One classify request carrying a sampled trace context; it must answer 200 whatever the collector does."""
    r = httpx.post(f"{url}/v1/classify", json={"text": text}, headers=_traceparent()[2], timeout=30)
    assert r.status_code == 200, r.text


def _dropped_within(url: str, reason: str, seconds: float = 20) -> float:
    """The spans counted as dropped for ``reason``, once the count moves or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while metric(url, DROPPED, reason=reason) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return metric(url, DROPPED, reason=reason)


def test_a_receiver_that_is_down_fails_no_request_and_what_is_lost_is_counted(
    tiny_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that refuses connections: every export fails at once, no request does."""
    _trace_to(monkeypatch, f"http://127.0.0.1:{free_port()}", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    with LiveServer(_settings(tiny_models)) as server:
        for i in range(5):
            _traced_classify(server.url, f"nobody collects this {i}")
        assert _dropped_within(server.url, "export_failed") > 0


def test_a_receiver_that_hangs_fills_the_queue_and_what_is_lost_is_counted(
    tiny_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that takes connections and never answers: each export holds the exporter for its whole
    timeout, so spans ending meanwhile overflow the bounded queue; they are dropped and counted, and no
    request waits for them. (With a refused connection the export fails in milliseconds and the queue may
    never fill: that made a queue_full assertion flaky.)"""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
        _trace_to(
            monkeypatch,
            f"http://127.0.0.1:{hole.getsockname()[1]}",
            OTEL_EXPORTER_OTLP_TIMEOUT="2",  # seconds: each export gives up after two
            OTEL_BSP_MAX_QUEUE_SIZE="8",  # a request makes several spans: a few requests fill it
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE="8",
        )
        with LiveServer(_settings(tiny_models)) as server:
            for i in range(40):  # until the queue has overflowed: a few requests while an export hangs
                _traced_classify(server.url, f"nobody answers for this {i}")
                if metric(server.url, DROPPED, reason="queue_full") > 0:
                    break
            assert metric(server.url, DROPPED, reason="queue_full") > 0
            assert _dropped_within(server.url, "export_failed") > 0


def test_the_otlp_protocol_is_the_standard_variables_and_one_without_an_exporter_is_refused() -> None:
    assert protocol_from_environment({}) == "grpc"
    assert protocol_from_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) == "http/protobuf"
    both = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}
    assert protocol_from_environment(both) == "grpc"  # the per-signal variable wins
    with pytest.raises(ValueError, match="http/json"):
        protocol_from_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_a_request_is_traced_door_admission_core_cache_tokenize_queue_and_the_batch_it_rode_in(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["bert-classifier"], CACHE_ENABLED=True)
    with LiveServer(settings) as server:
        assert spans.on()
        traces = []
        for _ in range(2):  # the second is the first's cache hit
            trace_id, _parent, headers = _traceparent()
            r = httpx.post(f"{server.url}/v1/classify", json={"text": "traced"}, headers=headers, timeout=30)
            assert r.status_code == 200, r.text
            traces.append(receiver.wait_for(trace_id, "POST /v1/classify"))
        version = server.pipeline("bert-classifier").model.version
    assert not spans.on()  # the app's end turned its spans off

    computed, cached = traces
    door = _one(computed, "POST /v1/classify")
    admission, core = _one(computed, "admission"), _one(computed, "text-classification")
    assert admission.parent_span_id == door.span_id and admission.attributes["inference.admitted"] is True
    assert core.parent_span_id == door.span_id
    assert core.attributes["inference.model.name"] == "bert-classifier"
    assert core.attributes["inference.model.version"] == version
    for name in ("cache lookup", "tokenize", "queue"):
        assert _one(computed, name).parent_span_id == core.span_id, name
    assert _one(computed, "cache lookup").attributes["cache.hit"] is False
    assert _one(cached, "cache lookup").attributes["cache.hit"] is True
    assert not [s for s in cached if s.name in ("tokenize", "queue")]  # a hit computes nothing

    queue = _one(computed, "queue")
    ((batch_trace, batch_span),) = queue.links  # the batch it rode in
    (batch,) = [s for s in receiver.named("batch") if s.span_id == batch_span]
    assert batch.trace_id == batch_trace != door.trace_id  # its own trace: one run serves many requests
    assert (door.trace_id, core.span_id) in batch.links  # and it says whom it served
    attributes = batch.attributes
    assert attributes["inference.model.name"] == "bert-classifier"
    assert attributes["inference.model.version"] == version
    assert attributes["inference.model.variant"] == server.pipeline("bert-classifier").model.variant.name
    assert attributes["inference.device"] == "cpu"
    assert attributes["inference.batch.size"] == 1
    assert attributes["inference.batch.padded_length"] > 0
    queue = _one(computed, "queue")
    assert (
        queue.span.end_time_unix_nano <= batch.span.start_time_unix_nano + 1_000_000
    )  # the wait, then the run


def test_eight_concurrent_requests_make_one_batch_span_linked_to_all_eight(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        SERVED_MODELS=["bert-classifier"],
        CACHE_ENABLED=False,
        MAX_BATCH_SIZE=8,
        MAX_QUEUE_DELAY_MS=5000,  # the batch forms when the 8th arrives, not before
    )
    sent = [_traceparent() for _ in range(8)]
    with LiveServer(settings) as server, ThreadPoolExecutor(8) as pool:
        server.occupy("bert-classifier", 1.0)  # all 8 queue while the model is busy

        def classify(i: int) -> int:
            body = {"text": f"the same length {i}"}
            return httpx.post(
                f"{server.url}/v1/classify", json=body, headers=sent[i][2], timeout=60
            ).status_code

        assert list(pool.map(classify, range(8))) == [200] * 8
        traces = [receiver.wait_for(trace_id, "queue") for trace_id, _, _ in sent]
    cores = {_one(t, "text-classification").trace_id: _one(t, "text-classification").span_id for t in traces}
    batch_ids = {_one(t, "queue").links[0] for t in traces}
    assert len(batch_ids) == 1, batch_ids  # every request's trace reaches the same batch span
    ((batch_trace, batch_span),) = batch_ids
    (batch,) = [s for s in receiver.named("batch") if s.span_id == batch_span and s.trace_id == batch_trace]
    assert batch.attributes["inference.batch.size"] == 8
    assert sorted(batch.links) == sorted(cores.items())  # and it links each request's span


def test_the_grpc_door_continues_the_trace_in_the_call_metadata(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    port = free_port()
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["bert-classifier"], CACHE_ENABLED=False, GRPC_PORT=port
    )
    trace_id, parent_id, headers = _traceparent()
    with LiveServer(settings):
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            text = tgrpc.InferInput("text", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"a traced call"], dtype=np.object_))
            result = client.infer("bert-classifier", [text], headers=headers)
            assert result.get_response().outputs
        finally:
            client.close()
        traced = receiver.wait_for(trace_id, "queue")
        door = _one(traced, "/inference.GRPCInferenceService/ModelInfer")
    assert door.span.kind == SERVER
    assert door.parent_span_id == parent_id
    assert door.attributes["rpc.system"] == "grpc"
    core = _one(traced, "text-classification")
    assert core.parent_span_id == door.span_id
    assert _one(traced, "queue").parent_span_id == core.span_id


def _generation_settings(tiny_models: Path) -> Settings:
    return Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["gpt"], CACHE_ENABLED=False)


def test_a_generation_is_one_genai_span_with_queue_prefill_and_decode_and_its_first_token(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    trace_id, _parent, headers = _traceparent()
    with LiveServer(_generation_settings(tiny_models)) as server:
        body = {"prompt": "ROMEO:", "max_new_tokens": 5, "temperature": 0}
        r = httpx.post(f"{server.url}/v1/generate", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        traced = receiver.wait_for(trace_id, "text_completion gpt")
    answer = r.json()["results"][0]
    generation = _one(traced, "text_completion gpt")
    attributes = generation.attributes
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.model"] == "gpt"
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.usage.output_tokens"] == answer["completion_tokens"]
    assert attributes["gen_ai.usage.input_tokens"] == r.json()["usage"]["input_tokens"]
    assert attributes["gen_ai.response.finish_reasons"] == [answer["finish_reason"]]
    assert generation.parent_span_id == _one(traced, "text-generation").span_id
    queue, prefill, decode = (_one(traced, n) for n in ("queue", "prefill", "decode"))
    assert {queue.parent_span_id, prefill.parent_span_id, decode.parent_span_id} == {generation.span_id}
    assert decode.attributes["gen_ai.usage.output_tokens"] == answer["completion_tokens"]
    first = decode.events["first_token"]
    assert 0 < first["gen_ai.server.time_to_first_token"] <= generation.seconds
    ((batch_trace, batch_span),) = prefill.links  # the prefill's model run
    (batch,) = [s for s in receiver.named("batch") if s.span_id == batch_span]
    assert batch.trace_id == batch_trace and batch.attributes["inference.batch.phase"] == "prefill"
    assert (trace_id, generation.parent_span_id) in batch.links
    assert not [s for s in traced if s.name not in _GENERATION_SPANS]  # no span per token


_GENERATION_SPANS = {
    "POST /v1/generate",
    "admission",
    "text-generation",
    "cache lookup",
    "tokenize",
    "text_completion gpt",
    "queue",
    "prefill",
    "decode",
}


def test_a_streams_spans_end_when_its_client_hangs_up(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    with LiveServer(_generation_settings(tiny_models)) as server:
        engine = server.pipeline("gpt").engine
        trace_id, _parent, headers = _traceparent()
        body = {
            "prompt": "ROMEO:",
            "max_new_tokens": engine.max_context - 8,
            "temperature": 0,
            "stream": True,
        }
        with (
            httpx.Client(base_url=server.url, timeout=60) as client,
            client.stream("POST", "/v1/generate", json=body, headers=headers) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:"):
                    # The model is held busy, so the sequence is still running when the client leaves.
                    server.occupy("gpt", 1.0)
                    break
        hung_up = time.monotonic()
        traced = receiver.wait_for(trace_id, "text_completion gpt")
        assert time.monotonic() - hung_up < 20
    generation = _one(traced, "text_completion gpt")
    assert generation.attributes["gen_ai.response.finish_reasons"] == ["cancelled"]
    assert 1 <= generation.attributes["gen_ai.usage.output_tokens"] < engine.max_context - 8
    decode = _one(traced, "decode")
    assert decode.span.end_time_unix_nano <= generation.span.end_time_unix_nano
    door = _one(traced, "POST /v1/generate")  # the door's span ended too, with the stream
    assert door.span.end_time_unix_nano >= generation.span.start_time_unix_nano


def test_spans_go_over_otlp_http_protobuf_when_the_protocol_says_so(
    tiny_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OtlpHttpReceiver() as receiver:
        _trace_to(monkeypatch, receiver.endpoint, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf")
        trace_id, _parent, headers = _traceparent()
        with LiveServer(_settings(tiny_models)) as server:
            r = httpx.post(
                f"{server.url}/v1/classify", json={"text": "over http"}, headers=headers, timeout=30
            )
            assert r.status_code == 200, r.text
            traced = receiver.wait_for(trace_id, "queue")
    assert {"POST /v1/classify", "text-classification", "queue"} <= {s.name for s in traced}


def test_a_traced_requests_latency_carries_its_trace_id_as_an_openmetrics_exemplar(
    tiny_models: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _trace_to(monkeypatch, receiver.endpoint)
    trace_id, _parent, headers = _traceparent()
    with LiveServer(_settings(tiny_models)) as server:
        r = httpx.post(f"{server.url}/v1/classify", json={"text": "exemplary"}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        scrape = httpx.get(
            f"{server.url}/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=10
        )
        door = receiver.wait_for(trace_id, "POST /v1/classify")
    assert scrape.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [
        s.exemplar.labels
        for family in openmetrics.text_string_to_metric_families(scrape.text)
        if family.name == "tserve_http_request_duration_seconds"
        for s in family.samples
        if s.exemplar is not None and s.labels.get("route") == "/v1/classify"
    ]
    assert {"trace_id": trace_id, "span_id": _one(door, "POST /v1/classify").span_id} in exemplars


def test_json_logs_carry_the_trace_and_span_of_the_request_they_were_written_in(
    tiny_models: Path, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env = {
        "MODEL_REPOSITORY": str(tiny_models),
        "SERVED_MODELS": "bert-classifier",
        "CACHE_ENABLED": "false",
        "LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    trace_id, _parent, headers = _traceparent()
    with ServiceProcess(env, log_path=tmp_path / "service.log", stop_grace_s=10) as service:
        r = httpx.post(f"{service.url}/v1/classify", json={"text": "logged"}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        door = _one(receiver.wait_for(trace_id, "POST /v1/classify"), "POST /v1/classify")
    lines = [line for line in (tmp_path / "service.log").read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object, uvicorn's own too
    assert any(rec["logger"].startswith("uvicorn") for rec in records)
    (access,) = [rec for rec in records if rec["logger"] == "service.access" and rec["trace_id"] == trace_id]
    assert access["span_id"] == door.span_id
    assert access["request_id"] == r.headers["x-request-id"]
    assert access["model"] == "bert-classifier" and "/v1/classify" in access["message"]
    assert {"time", "level"} <= set(access)


def test_the_final_export_at_shutdown_is_bounded_when_the_collector_does_not_answer(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that accepts connections and never answers held an idle service's exit for the
    exporter's whole timeout (6-8 s with the defaults): the final flush now gives up after its bound."""
    from service.observe.tracing import Tracing

    with socket.socket() as silent:  # listens, never accepts: connections hang in its backlog
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        _trace_to(monkeypatch, f"http://127.0.0.1:{silent.getsockname()[1]}", OTEL_EXPORTER_OTLP_TIMEOUT="30")
        tracing = Tracing.from_environment()
        assert tracing.provider is not None
        tracing.provider.get_tracer("test").start_span("queued at exit").end()
        assert tracing.shutdown(within_s=0.5) is False  # gave up on the collector, did not wait 30 s

    _trace_to(monkeypatch, receiver.endpoint)  # a collector that answers: everything exported in time
    tracing = Tracing.from_environment()
    assert tracing.provider is not None
    tracing.provider.get_tracer("test").start_span("exported at exit").end()
    assert tracing.shutdown(within_s=10) is True
    assert receiver.named("exported at exit")
