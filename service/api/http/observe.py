"""Per-request bookkeeping, in one middleware: the request id (``request_id.py``), the request context
(id, model) for logs, HTTP metrics (requests open, answered, latency), and the access log. Admission
(the body, the in-flight bound) is ``admission.py``, inside this one and the key check.

One middleware rather than one per job: each ASGI layer wraps ``send`` and ``receive`` again, and a
request crosses every layer several times. It runs once a route matched (so the route label is the
path template, never a client-chosen path). The model label is
whatever model the inference layer resolved for the request (empty for
routes without one), so failed requests are attributed too.

The access log line (logger ``service.access``, INFO) holds the request id,
method, route, status, model, body sizes and seconds: never request or
response content.

With traces on (``tracing.py``), each request but probes and scrapes gets its server span here, named
``{method} {route}`` by the route's template (never the client's path) with the HTTP semantic conventions'
attributes, continuing the caller's ``traceparent``; it is current for everything below, the access log
line included, and ends with the response's last byte. A sampled request's latency is observed with an
exemplar, its trace and span ids, which ``/metrics`` shows to a scraper that asks for OpenMetrics: a
dashboard goes from a slow bucket to a trace. (Litestar's OpenTelemetry plugin, OpenTelemetry's ASGI
middleware, made the same span at more than twice the cost per request: a layer of its own that wraps
every ASGI message; ``benchmarks/tracing.py``.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send
from opentelemetry import propagate
from opentelemetry.semconv.attributes import (
    client_attributes,
    http_attributes,
    network_attributes,
    url_attributes,
    user_agent_attributes,
)

from service.api.http.admission import ALWAYS_ANSWERED
from service.api.http.meta import set_meta
from service.api.http.request_id import assign_request_id, with_request_id
from service.context import RequestContext, bind, unbind
from service.metadata import RequestMeta
from service.observe import spans
from service.observe.metrics import Metrics

access_log = logging.getLogger("service.access")


def observe_requests(metrics: Metrics, log_access: bool = True) -> Callable[[ASGIApp], ASGIApp]:
    # The labelled children per (route, method, model, status): prometheus_client's labels() takes a
    # lock and builds a key on every call, a measurable share of the event loop's time per request.
    cache: dict[tuple[str, str, str, int], tuple[Any, Any]] = {}

    in_flight_children: dict[str, Any] = {}

    def in_flight_of(route: str) -> Any:
        child = in_flight_children.get(route)
        if child is None:
            child = in_flight_children[route] = metrics.http_in_flight.labels(route)
        return child

    def children(route: str, method: str, model: str, status: int) -> tuple[Any, Any]:
        key = (route, method, model, status)
        if key not in cache:
            labels = (route, method, model, str(status))
            cache[key] = (metrics.http_requests.labels(*labels), metrics.http_latency.labels(*labels))
        return cache[key]

    def middleware_factory(app: ASGIApp) -> ASGIApp:
        carried = propagate.get_global_textmap().fields  # the headers a trace travels in (OTEL_PROPAGATORS)

        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            rid = assign_request_id(scope)
            route = scope.get("path_template") or "unmatched"
            method = scope["method"]  # type: ignore[typeddict-item]  # http scopes have one
            serving = (
                spans.serve(
                    f"{method} {route}", _carrier(scope, carried), _request_attributes(scope, method, route)
                )
                if spans.on() and not route.startswith(ALWAYS_ANSWERED)
                else None
            )
            context = RequestContext(request_id=rid)
            set_meta(scope, RequestMeta(request_id=rid))
            token = bind(context)
            status = 500  # unless a response starts: an exception escaping here becomes a 500
            in_flight = in_flight_of(route)
            in_flight.inc()
            started = time.perf_counter()
            sizes = [0, 0]  # body bytes received, sent

            async def receive_observed() -> ReceiveMessage:
                message = await receive()
                if message["type"] == "http.request":
                    sizes[0] += len(message.get("body", b""))
                return message

            async def send_observed(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    with_request_id(message, rid)
                elif message["type"] == "http.response.body":
                    sizes[1] += len(message.get("body", b""))
                await send(message)

            try:
                await app(scope, receive_observed, send_observed)
            finally:
                elapsed = time.perf_counter() - started
                requests, latency = children(route, method, context.model, status)
                requests.inc()
                latency.observe(elapsed, spans.exemplar() if serving is not None else None)
                if log_access:
                    access_log.info(
                        "%s %s %d in=%dB out=%dB %.3fs", method, route, status, sizes[0], sizes[1], elapsed
                    )
                in_flight.dec()
                unbind(token)
                spans.served(serving, {http_attributes.HTTP_RESPONSE_STATUS_CODE: status}, status >= 500)

        return middleware

    return middleware_factory


def _carrier(scope: Scope, fields: set[str]) -> dict[str, str]:
    """The request's headers the trace propagator reads (``fields``: ``traceparent``, ``tracestate``,
    ``baggage``, or what ``OTEL_PROPAGATORS`` names), as it reads them (names are lowercase in ASGI)."""
    return {
        key: value.decode("latin-1")
        for name, value in scope["headers"]
        if (key := name.decode("latin-1")) in fields
    }


def _request_attributes(scope: Scope, method: str, route: str) -> dict[str, str | int]:
    """The HTTP server span's attributes known before the answer (the semantic conventions' stable names)."""
    attributes: dict[str, str | int] = {
        http_attributes.HTTP_REQUEST_METHOD: method,
        http_attributes.HTTP_ROUTE: route,
        url_attributes.URL_PATH: scope["path"],
        url_attributes.URL_SCHEME: scope.get("scheme", "http"),
        network_attributes.NETWORK_PROTOCOL_VERSION: scope.get("http_version", "1.1"),
    }
    client = scope.get("client")
    if client:
        attributes[client_attributes.CLIENT_ADDRESS] = client[0]
    for name, value in scope["headers"]:
        if name == b"user-agent":
            attributes[user_agent_attributes.USER_AGENT_ORIGINAL] = value.decode("latin-1")
    return attributes
