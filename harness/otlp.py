"""Real OTLP trace receivers on loopback: opentelemetry-proto's ``TraceService`` served by grpcio, as vLLM's
own tracing tests do it, and the same request as an HTTP/protobuf POST to ``/v1/traces``. Each keeps every
span it is sent, with its resource."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass
class ReceivedSpan:
    span: trace_pb2.Span
    resource: dict[str, Any]

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return {a.key: _value(a.value) for a in self.span.attributes}

    @property
    def links(self) -> list[tuple[str, str]]:
        """(trace id, span id) of each span this one links to."""
        return [(link.trace_id.hex(), link.span_id.hex()) for link in self.span.links]

    @property
    def events(self) -> dict[str, dict[str, Any]]:
        return {e.name: {a.key: _value(a.value) for a in e.attributes} for e in self.span.events}

    @property
    def seconds(self) -> float:
        return (self.span.end_time_unix_nano - self.span.start_time_unix_nano) / 1e9


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class ReceivedSpans:
    """What a receiver keeps: every span it was sent, with its resource, and how many exports brought them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []
        self.exports = 0

    def keep(self, request: Any) -> None:
        """Every span of one ``ExportTraceServiceRequest``."""
        with self.lock:
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.spans.extend(ReceivedSpan(s, resource) for s in ss.spans)
            self.exports += 1

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, name: str, timeout_s: float = 30) -> list[ReceivedSpan]:
        """The trace's spans once one called ``name`` has arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.of_trace(trace_id)
            if any(s.name == name for s in spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"no span {name!r} of trace {trace_id} within {timeout_s} s: {self.spans}")


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: ReceivedSpans) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver(ReceivedSpans):
    """OTLP over gRPC (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` = ``endpoint``)."""

    def __init__(self) -> None:
        super().__init__()
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpReceiver:
        self.server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.stop(grace=None)


class OtlpHttpReceiver(ReceivedSpans):
    """OTLP over HTTP with protobuf bodies: ``POST /v1/traces`` (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` =
    ``endpoint``, which names the path, as the specification has it for the per-signal variable)."""

    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.keep(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def __enter__(self) -> OtlpHttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.http.shutdown()
        self.http.server_close()
