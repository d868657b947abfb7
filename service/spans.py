"""The spans made inside a request, on the tracer provider ``tracing.py`` turned on; nothing while traces are off.

Every layer (the doors, the core, the cache, the pipelines, the engine) makes its spans here, so each pays
one check of a module global while traces are off: no tracer, no context copied, no span object. The
provider is the process's, as OpenTelemetry's global one is, but one that can be switched back off: a test
process starts many apps, each with its own provider or none.

A request's own span, the server span each door starts (``serve``), continues the caller's W3C
``traceparent`` / ``tracestate`` through OpenTelemetry's configured propagator (``OTEL_PROPAGATORS``); inside
a request that is not sampled, ``span`` makes nothing either.

Work that another task or thread does for a request (a batch, a decoding loop) carries the request's
context (``current_context``) and records its spans when it knows their times (``record``): a queue wait is
known once the batch starts, a model run once it ends. Times are ``time.monotonic()`` readings, turned
into the wall-clock nanoseconds spans carry when recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

Attributes = Mapping[str, AttributeValue]
Event = tuple[str, float, Attributes]  # name, time.monotonic() when it happened, attributes

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_OFF: AbstractContextManager[None] = contextlib.nullcontext()


def activate(provider: TracerProvider) -> None:
    """Spans from now on go to ``provider`` (an app with traces on, at its start)."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("service")


def deactivate(provider: TracerProvider) -> None:
    """Back to no spans, unless another provider was activated since (an app with traces on, at its end)."""
    global _tracer, _provider
    if _provider is provider:
        _provider = _tracer = None


def on() -> bool:
    return _tracer is not None


class _Current:
    """``span``'s context manager: the span current inside the block, ended (with its error) at its end.
    The SDK's ``start_as_current_span`` does the same through two more layers of context managers."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        self.span.end()
        otel_context.detach(self.token)


def span(name: str, attributes: Attributes | None = None) -> AbstractContextManager[Span | None]:
    """A child of the current span, current inside the ``with`` block; ``None`` there while traces are off
    or the request is not sampled."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    parent = trace.get_current_span()
    if not parent.is_recording():
        return _OFF
    return _Current(tracer.start_span(name, attributes=attributes))


def serve(name: str, carrier: Mapping[str, str], attributes: Attributes) -> tuple[Span, object] | None:
    """A request's server span, continuing the trace ``carrier`` (its headers or metadata, lowercase names)
    carries, made current; ``served`` ends it. ``None`` while traces are off."""
    tracer = _tracer
    if tracer is None:
        return None
    request = tracer.start_span(name, propagate.extract(carrier), SpanKind.SERVER, attributes)
    return request, otel_context.attach(trace.set_span_in_context(request))


def served(serving: tuple[Span, object] | None, attributes: Attributes, failed: bool) -> None:
    """The end of ``serve``'s span, with its last attributes; ``failed``: the server's fault (a 5xx)."""
    if serving is None:
        return
    request, token = serving
    request.set_attributes(attributes)
    if failed:
        request.set_status(StatusCode.ERROR)
    request.end()
    otel_context.detach(token)  # type: ignore[arg-type]


def current_context() -> Context | None:
    """The current context, for work done elsewhere on the request's behalf; ``None`` while traces are off
    or when the request is not sampled (nothing of it is recorded, so nothing needs carrying)."""
    if _tracer is None:
        return None
    ctx = otel_context.get_current()
    return ctx if trace.get_current_span(ctx).is_recording() else None


def link_to(ctx: Context | Span) -> Link:
    """A link to the span of ``ctx`` (or to ``ctx`` itself, a span)."""
    target = ctx if isinstance(ctx, Span) else trace.get_current_span(ctx)
    return Link(target.get_span_context())


def wall_ns(monotonic_s: float, now_ns: int | None = None) -> int:
    """A ``time.monotonic()`` reading as the wall-clock nanoseconds a span carries."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - int((time.monotonic() - monotonic_s) * 1e9)


def start(
    name: str,
    parent: Context | Span | None,
    at: float,
    attributes: Attributes | None = None,
    links: Sequence[Link] = (),
) -> Span | None:
    """A span begun at ``at`` (monotonic): a child of ``parent`` (a context or a span), or a new trace's root
    when ``parent`` is None. The caller ends it (``end``). ``None`` while traces are off."""
    tracer = _tracer
    if tracer is None:
        return None
    if isinstance(parent, Span):
        parent = trace.set_span_in_context(parent, Context())
    elif parent is None:
        parent = Context()  # empty: a root, not a child of whatever is current
    return tracer.start_span(name, parent, attributes=attributes, links=links, start_time=wall_ns(at))


def end(
    span: Span | None, at: float, events: Iterable[Event] = (), attributes: Attributes | None = None
) -> None:
    """End ``span`` at ``at`` (monotonic), with its events and last attributes."""
    if span is None:
        return
    now_ns = time.time_ns()
    for event_name, when, event_attributes in events:
        span.add_event(event_name, event_attributes, timestamp=wall_ns(when, now_ns))
    if attributes:
        span.set_attributes(attributes)
    span.end(end_time=wall_ns(at, now_ns))


def record(
    name: str,
    parent: Context | Span | None,
    began: float,
    ended: float,
    attributes: Attributes | None = None,
    links: Sequence[Link] = (),
    events: Iterable[Event] = (),
) -> Span | None:
    """A span that is already over: from ``began`` to ``ended`` (monotonic readings)."""
    recorded = start(name, parent, began, attributes, links)
    end(recorded, ended, events)
    return recorded


def exemplar() -> dict[str, str] | None:
    """The current span's trace and span ids as a histogram exemplar's labels, when it records."""
    if _tracer is None:
        return None
    ids = trace.get_current_span().get_span_context()
    if not ids.trace_flags.sampled:
        return None
    return {"trace_id": format(ids.trace_id, "032x"), "span_id": format(ids.span_id, "016x")}
