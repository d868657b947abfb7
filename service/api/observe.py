"""Per-request bookkeeping: the request context (id, model) for logs, in-flight counting, HTTP metrics.

Runs inside the request-id middleware, once a route matched (so the route
label is the path template, never a client-chosen path). The model label is
whatever model the inference layer resolved for the request (empty for
routes without one), so failed requests are attributed too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service.context import RequestContext, bind, unbind
from service.lifecycle import Lifecycle
from service.metrics import Metrics

from .request_id import STATE_KEY


def observe_requests(metrics: Metrics, lifecycle: Lifecycle) -> Callable[[ASGIApp], ASGIApp]:
    def middleware_factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            route = scope.get("path_template") or "unmatched"
            method = scope["method"]  # type: ignore[typeddict-item]  # http scopes have one
            context = RequestContext(request_id=str((scope.get("state") or {}).get(STATE_KEY, "")))
            token = bind(context)
            status = 500  # unless a response starts: an exception escaping here becomes a 500
            in_flight = metrics.http_in_flight.labels(route)
            in_flight.inc()
            lifecycle.request_started()
            started = time.perf_counter()

            async def send_observed(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_observed)
            finally:
                labels = (route, method, context.model, str(status))
                metrics.http_requests.labels(*labels).inc()
                metrics.http_latency.labels(*labels).observe(time.perf_counter() - started)
                in_flight.dec()
                lifecycle.request_finished()
                unbind(token)

        return middleware

    return middleware_factory
