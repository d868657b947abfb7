"""A real OTLP/gRPC trace receiver on loopback: opentelemetry-proto's ``TraceService`` served by grpcio, as
vLLM's own tracing tests do it. It keeps every span it is sent, with its resource."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        with self.receiver.lock:
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.receiver.spans.extend(ReceivedSpan(s, resource) for s in ss.spans)
            self.receiver.exports += 1
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
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
