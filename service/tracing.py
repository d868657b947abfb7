"""OpenTelemetry traces, off unless an OTLP endpoint is configured, by the standard ``OTEL_*`` variables only.

On when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (as TGI's
``--otlp-endpoint`` turns its traces on), unless ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``.
Everything else is the SDK's own reading of the environment: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the service name defaults to ``transformer-serving``), ``OTEL_TRACES_SAMPLER``
and its argument, the exporter's ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout, insecure), and the
batch processor's bounded queue ``OTEL_BSP_*``: spans past it are dropped, never waited for, so a collector
that is down or slow never holds up a request. Export is OTLP over gRPC.

Off, nothing is installed: no middleware, no provider, and the API's no-op tracer everywhere.

Each HTTP request gets a server span from Litestar's ASGI instrumentation, continuing the caller's W3C
``traceparent`` / ``tracestate``, named ``{method} {route}`` by the route's template (not its path) with
the HTTP semantic conventions' attributes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from litestar.enums import ScopeType
from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryPlugin
from litestar.types import Scope
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "transformer-serving"


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


class Tracing:
    """One app's tracer provider (or none, when traces are off) and the Litestar plugin that uses it."""

    def __init__(self, provider: TracerProvider | None) -> None:
        self.provider = provider

    @classmethod
    def from_environment(cls) -> Tracing:
        if not tracing_configured():
            return cls(None)
        # Imported only when on: the exporter pulls in the OTLP protobufs.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider = TracerProvider(resource=resource_from_environment())  # sampler: OTEL_TRACES_SAMPLER
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("traces: exported over OTLP/gRPC (OTEL_* settings)")
        return cls(provider)

    def plugins(self) -> list[OpenTelemetryPlugin]:
        """Litestar's instrumentation (the request's server span), or nothing when traces are off."""
        if self.provider is None:
            return []
        config = OpenTelemetryConfig(
            tracer_provider=self.provider,
            scope_span_details_extractor=_span_details,
            exclude_spans=["receive", "send"],  # one span per ASGI message is noise, not a phase
            scopes={ScopeType.HTTP},
        )
        return [OpenTelemetryPlugin(config)]

    def shutdown(self) -> None:
        """Export what is still queued (bounded by the exporter's timeout), then stop."""
        if self.provider is not None:
            self.provider.shutdown()


def _span_details(scope: Scope) -> tuple[str, dict[str, Any]]:
    """The span's first name, ``{method}``: the route is not matched yet when it starts (the semantic
    conventions' name without a route); ``api/http/observe.py`` renames it ``{method} {route}`` by the
    route's template (never the client's path) once it is."""
    return str(scope.get("method", "HTTP")).strip() or "HTTP", {}
