"""OpenTelemetry traces, off unless an OTLP endpoint is configured, by the standard ``OTEL_*`` variables only.

On when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (as TGI's
``--otlp-endpoint`` turns its traces on), unless ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``.
Everything else is the SDK's own reading of the environment: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the service name defaults to ``transformer-serving``), ``OTEL_TRACES_SAMPLER``
and its argument, the exporter's ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout, insecure), and the
batch processor's bounded queue ``OTEL_BSP_*``: spans past it are dropped, never waited for, so a collector
that is down or slow never holds up a request; what is dropped (a full queue, a failed export) is counted
(``tserve_trace_spans_dropped_total``). Export is OTLP over gRPC, or over HTTP with protobuf bodies when
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (or ``OTEL_EXPORTER_OTLP_PROTOCOL``) is ``http/protobuf``.

Off, nothing is installed: no interceptor, no provider, and ``spans.py`` makes no spans.

Each HTTP request gets a server span from ``api/http/observe.py``, continuing the caller's W3C
``traceparent`` / ``tracestate``, named ``{method} {route}`` by the route's template (not its path) with
the HTTP semantic conventions' attributes; each gRPC call one from grpcio's instrumentation, continuing the
trace in the call's metadata. The spans inside a request come from ``spans.py``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from service.observe import spans

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "transformer-serving"
PROTOCOLS = ("grpc", "http/protobuf")

# How long the final export may hold up an exit (SIGTERM): a collector that is down must not eat the pod's
# grace period.
FINAL_FLUSH_S = 1.0

OnDrop = Callable[[str, int], None]  # (reason, spans): queue_full, export_failed, already_shutdown


def tracing_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint, and neither the SDK nor traces turned off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def resource_from_environment() -> Resource:
    """The SDK's resource from the environment (``OTEL_SERVICE_NAME`` over ``OTEL_RESOURCE_ATTRIBUTES``'
    ``service.name``), with this service's name where neither gives one (the SDK's ``unknown_service``)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def protocol_from_environment(environ: Mapping[str, str] = os.environ) -> str:
    """The OTLP transport: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else
    gRPC. ``http/json`` has no Python exporter: refused at start-up, by name, rather than ignored."""
    chosen = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    if chosen not in PROTOCOLS:
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL {chosen!r} is not one this service exports with: {', '.join(PROTOCOLS)}"
        )
    return chosen


def otlp_exporter(protocol: str) -> SpanExporter:
    """The SDK's OTLP exporter for ``protocol``; it reads its endpoint, headers and timeout from ``OTEL_*``."""
    # Imported only when on: the exporters pull in the OTLP protobufs (and gRPC or requests).
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as OverHttp

        return OverHttp()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as OverGrpc

    return OverGrpc()


class CountingExporter(SpanExporter):
    """An exporter that counts the spans of every batch it failed to deliver (the collector down, slow past
    the exporter's timeout, or refusing them): lost, as the batch processor does not retry."""

    def __init__(self, exporter: SpanExporter, on_drop: OnDrop) -> None:
        self.exporter = exporter
        self.on_drop = on_drop

    def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(batch)
        except Exception:
            log.exception("traces: exporting %d span(s) failed", len(batch))
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.on_drop("export_failed", len(batch))
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _DropCount:
    """The batch processor's own accounting (the SDK's ``ProcessorMetricsT``): what it drops, counted."""

    def __init__(self, on_drop: OnDrop) -> None:
        self.on_drop = on_drop

    def register_queue_size(self, get_queue_size: Callable[[], int]) -> None:
        pass

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        self.on_drop(error_type, count)

    def finish_items(self, count: int) -> None:
        pass


def batch_processor(exporter: SpanExporter, on_drop: OnDrop) -> BatchSpanProcessor:
    """The SDK's batch processor (bounded by ``OTEL_BSP_MAX_QUEUE_SIZE``, never blocking the caller), with the
    spans it drops from its full queue counted. The SDK reports those only to an OpenTelemetry meter, and
    only with its internal metrics turned on, so the count is hooked where the processor keeps it."""
    processor = BatchSpanProcessor(CountingExporter(exporter, on_drop))
    inner = getattr(processor, "_batch_processor", None)
    if inner is not None and hasattr(inner, "_metrics"):
        inner._metrics = _DropCount(on_drop)
    else:  # pragma: no cover - an SDK that keeps it elsewhere: export failures are still counted
        log.warning("traces: this OpenTelemetry SDK's batch processor does not say what it drops")
    return processor


class Tracing:
    """One app's tracer provider (or none, when traces are off): what ``spans.py`` makes spans with."""

    def __init__(self, provider: TracerProvider | None, processor: BatchSpanProcessor | None = None) -> None:
        self.provider = provider
        if provider is not None and processor is not None:
            spans.activate(provider, processor)

    @classmethod
    def from_environment(cls, on_drop: OnDrop = lambda reason, count: None) -> Tracing:
        """Traces as the ``OTEL_*`` variables say, or none; ``on_drop`` counts the spans lost on the way."""
        if not tracing_configured():
            return cls(None)
        protocol = protocol_from_environment()
        provider = TracerProvider(resource=resource_from_environment())  # sampler: OTEL_TRACES_SAMPLER
        processor = batch_processor(otlp_exporter(protocol), on_drop)
        provider.add_span_processor(processor)
        log.info("traces: exported over OTLP (%s; OTEL_* settings)", protocol)
        return cls(provider, processor)

    def grpc_interceptors(self) -> list[Any]:
        """grpcio's instrumentation for the gRPC door's server (its span per call), or nothing when off."""
        if self.provider is None:
            return []
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        return [aio_server_interceptor(tracer_provider=self.provider)]

    def shutdown(self, within_s: float = FINAL_FLUSH_S) -> bool:
        """Export what is still queued, then stop: for ``within_s`` at most. The SDK's own shutdown waits for
        the exporter's timeout and retries (6-8 s with a collector that is down), most of the grace period a
        pod gets; past the bound the spans still queued are dropped and the process goes on. Whether the
        export finished in time."""
        if self.provider is None:
            return True
        spans.deactivate(self.provider)
        stopping = threading.Thread(target=self.provider.shutdown, name="trace-flush", daemon=True)
        stopping.start()
        stopping.join(within_s)
        if stopping.is_alive():
            log.warning(
                "traces: the final export took over %.1f s; the spans still queued are dropped", within_s
            )
            return False
        return True
