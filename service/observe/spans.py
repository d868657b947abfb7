"""The spans of a request, on the tracer provider ``tracing.py`` turned on; nothing while traces are off.

Every layer (the doors, the core, the cache, the pipelines, the engine) makes its spans here, so each pays
one check of a module global while traces are off: no context copied, no span object. The provider is the
process's, as OpenTelemetry's global one is, but one that can be switched back off: a test process starts
many apps, each with its own provider or none.

A request's own span, the server span the HTTP door starts (``serve``), continues the caller's W3C
``traceparent`` / ``tracestate`` through OpenTelemetry's configured propagator (``OTEL_PROPAGATORS``) and
asks the provider's sampler (``OTEL_TRACES_SAMPLER``) whether to record the trace; every span under it
follows that decision, as the parent-based samplers do and the ratio sampler does for a trace's spans
(its decision is the trace id's), and inside a request that is not sampled nothing is made at all.

The spans are made here rather than by the SDK's ``Tracer``: a span is timed (its context current while
it runs, as a ``NonRecordingSpan`` carrying its ids, so logs, exemplars and children see it), and only
when it ends is it written once, as the SDK's ``ReadableSpan``, and handed to the provider's span
processor, which exports it. The SDK's span objects, with their locks, limits and checks on every
attribute, cost about 45 us each to start and end, several times this; with half a dozen spans a request,
that was the difference between traces costing a fifth of the service's throughput and not
(``benchmarks/tracing.py``). The gRPC door's server span is grpcio's instrumentation's, an SDK span;
the spans under it are made here like any other.

Work that another task or thread does for a request (a batch, a decoding loop) carries the request's
context (``current_context``) and records its spans when it knows their times (``record``): a queue wait is
known once the batch starts, a model run once it ends. Times are ``time.monotonic()`` readings, turned into
the wall-clock nanoseconds spans carry when recorded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import AttributeValue

log = logging.getLogger(__name__)

Attributes = Mapping[str, AttributeValue]
EventAt = tuple[str, float, Attributes]  # name, time.monotonic() when it happened, attributes

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("service")
_OFF: AbstractContextManager[None] = contextlib.nullcontext()


class _Recorder:
    """What spans are written with: the provider's resource, sampler and id generator, and its span
    processor (the batch processor ``tracing.py`` gave it)."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor) -> None:
        self.provider = provider
        self.processor = processor
        self.resource: Resource = provider.resource
        self.sampler: Sampler = provider.sampler
        self.ids: IdGenerator = provider.id_generator


_recorder: _Recorder | None = None


def activate(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Spans from now on go to ``processor``, with ``provider``'s resource, sampler and ids (an app with
    traces on, at its start; ``processor`` is one ``provider`` has, so the SDK's own spans go there too)."""
    global _recorder
    _recorder = _Recorder(provider, processor)


def deactivate(provider: TracerProvider) -> None:
    """Back to no spans, unless another provider was activated since (an app with traces on, at its end)."""
    global _recorder
    if _recorder is not None and _recorder.provider is provider:
        _recorder = None


def on() -> bool:
    return _recorder is not None


_offset_ns = 0  # the wall clock's reading minus the monotonic clock's, read again every few seconds
_offset_read_at = -1e9


def wall_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` reading as the wall-clock nanoseconds a span carries. One offset between the
    clocks serves every conversion for a few seconds, so readings keep their order (a span's end and its
    parent's, taken at the same instant, stay equal) while the wall clock's adjustments are followed."""
    global _offset_ns, _offset_read_at
    now = time.monotonic()
    if now - _offset_read_at > 10:
        _offset_read_at = now
        _offset_ns = time.time_ns() - int(now * 1e9)
    return int(monotonic_s * 1e9) + _offset_ns


class Timed:
    """One span: its ids, what it says, and when it began; written (to the processor) when it ends.

    Used as a context manager it is the current span inside the block and ends at its end, with the
    error that left the block, if any."""

    __slots__ = ("_token", "attributes", "context", "kind", "links", "name", "parent", "start_ns", "status")

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: Attributes | None,
        kind: SpanKind = SpanKind.INTERNAL,
        links: Sequence[Link] = (),
        start_ns: int | None = None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes: dict[str, AttributeValue] = dict(attributes or {})
        self.links = links
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self.status = Status(StatusCode.UNSET)
        self._token: object = None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def fail(self, error: BaseException | str) -> None:
        """The span's work failed: status ERROR, with the error's type."""
        if isinstance(error, BaseException):
            self.attributes["error.type"] = type(error).__name__
            error = f"{type(error).__name__}: {error}"
        self.status = Status(StatusCode.ERROR, error)

    def end(self, end_ns: int | None = None, events: Sequence[Event] = ()) -> None:
        recorder = _recorder
        if recorder is None:  # traces were turned off meanwhile (the app stopped)
            return
        recorder.processor.on_end(
            ReadableSpan(
                self.name,
                self.context,
                self.parent,
                recorder.resource,
                self.attributes,
                events,
                self.links,
                self.kind,
                status=self.status,
                start_time=self.start_ns,
                end_time=time.time_ns() if end_ns is None else end_ns,
                instrumentation_scope=_SCOPE,
            )
        )

    def __enter__(self) -> Timed:
        self._token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(self.context)))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is not None:
            self.fail(error)
        self.end()
        otel_context.detach(self._token)  # type: ignore[arg-type]


def _child_of(recorder: _Recorder, parent: SpanContext) -> SpanContext:
    return SpanContext(parent.trace_id, recorder.ids.generate_span_id(), False, _SAMPLED, parent.trace_state)


def _sampled(parent: Context | SpanContext | Timed | None) -> SpanContext | None:
    """The parent's span context when it is a sampled span's (so its children are recorded), else None."""
    if isinstance(parent, Timed):
        return parent.context
    context = parent if isinstance(parent, SpanContext) else trace.get_current_span(parent).get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def _root(
    recorder: _Recorder, name: str, kind: SpanKind, parent: Context | None, attributes: Attributes
) -> Timed | None:
    """A span whose recording the sampler decides: a request's (continuing ``parent``, its caller's
    context) or a batch's (a new trace). None when not sampled."""
    caller = trace.get_current_span(parent).get_span_context() if parent is not None else INVALID_SPAN_CONTEXT
    trace_id = caller.trace_id if caller.is_valid else recorder.ids.generate_trace_id()
    decision = recorder.sampler.should_sample(parent, trace_id, name, kind, attributes)
    if not decision.decision.is_sampled():
        return None
    context = SpanContext(trace_id, recorder.ids.generate_span_id(), False, _SAMPLED, decision.trace_state)
    return Timed(
        name, context, caller if caller.is_valid else None, {**attributes, **decision.attributes}, kind
    )


def span(name: str, attributes: Attributes | None = None) -> AbstractContextManager[Timed | None]:
    """A child of the current span, current inside the ``with`` block; ``None`` there while traces are off
    or the request is not sampled."""
    recorder = _recorder
    if recorder is None:
        return _OFF
    parent = _sampled(None)
    if parent is None:
        return _OFF
    return Timed(name, _child_of(recorder, parent), parent, attributes)


class Serving:
    """``serve``'s span, current until ``served``; or, for a request the sampler passed over, only its
    unsampled context (so nothing under it is made, and the decision travels on)."""

    __slots__ = ("timed", "token")

    def __init__(self, timed: Timed | None, context: Context) -> None:
        self.timed = timed
        self.token = otel_context.attach(context)


def serve(name: str, carrier: Mapping[str, str], attributes: Attributes) -> Serving | None:
    """A request's server span, continuing the trace ``carrier`` (its headers, lowercase names) carries,
    made current; ``served`` ends it. ``None`` while traces are off."""
    recorder = _recorder
    if recorder is None:
        return None
    caller = propagate.extract(carrier)
    timed = _root(recorder, name, SpanKind.SERVER, caller, attributes)
    if timed is None:
        passed = trace.get_current_span(caller).get_span_context()
        unsampled = SpanContext(
            passed.trace_id if passed.is_valid else recorder.ids.generate_trace_id(),
            recorder.ids.generate_span_id(),
            False,
            TraceFlags(TraceFlags.DEFAULT),
            passed.trace_state,
        )
        return Serving(None, trace.set_span_in_context(NonRecordingSpan(unsampled), caller))
    return Serving(timed, trace.set_span_in_context(NonRecordingSpan(timed.context), caller))


def served(serving: Serving | None, attributes: Attributes, failed: bool) -> None:
    """The end of ``serve``'s span, with its last attributes; ``failed``: the server's fault (a 5xx)."""
    if serving is None:
        return
    if serving.timed is not None:
        serving.timed.attributes.update(attributes)
        if failed:
            serving.timed.status = Status(StatusCode.ERROR)
        serving.timed.end()
    otel_context.detach(serving.token)  # type: ignore[arg-type]


def current_context() -> Context | None:
    """The current context, for work done elsewhere on the request's behalf; ``None`` while traces are off
    or when the request is not sampled (nothing of it is recorded, so nothing needs carrying)."""
    if _recorder is None:
        return None
    ctx = otel_context.get_current()
    return ctx if _sampled(ctx) is not None else None


def link_to(target: Context | Timed) -> Link:
    """A link to ``target``'s span (a context's current span, or a span made here)."""
    if isinstance(target, Timed):
        return Link(target.context)
    return Link(trace.get_current_span(target).get_span_context())


def start(
    name: str,
    parent: Context | Timed | None,
    at: float,
    attributes: Attributes | None = None,
    links: Sequence[Link] = (),
) -> Timed | None:
    """A span begun at ``at`` (monotonic): a child of ``parent`` (a context or a span made here), or, when
    ``parent`` is None, a new trace's root, as the sampler decides. The caller ends it (``end``). ``None``
    while traces are off, or when it is not recorded."""
    recorder = _recorder
    if recorder is None:
        return None
    if parent is None:
        timed = _root(recorder, name, SpanKind.INTERNAL, None, attributes or {})
        if timed is not None:
            timed.links, timed.start_ns = links, wall_ns(at)
        return timed
    context = _sampled(parent)
    if context is None:
        return None
    return Timed(name, _child_of(recorder, context), context, attributes, links=links, start_ns=wall_ns(at))


def end(
    timed: Timed | None,
    at: float,
    events: Iterable[EventAt] = (),
    attributes: Attributes | None = None,
    error: BaseException | None = None,
) -> None:
    """End ``timed`` at ``at`` (monotonic), with its events, last attributes and error, if any."""
    if timed is None:
        return
    if attributes:
        timed.attributes.update(attributes)
    if error is not None:
        timed.fail(error)
    timed.end(wall_ns(at), [Event(name, dict(a), wall_ns(when)) for name, when, a in events])


def record(
    name: str,
    parent: Context | Timed | None,
    began: float,
    ended: float,
    attributes: Attributes | None = None,
    links: Sequence[Link] = (),
    events: Iterable[EventAt] = (),
) -> Timed | None:
    """A span that is already over: from ``began`` to ``ended`` (monotonic readings)."""
    timed = start(name, parent, began, attributes, links)
    end(timed, ended, events)
    return timed


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Around recording spans from the engine: a failure to trace is logged, never the request's failure
    (nor a batch left undelivered)."""
    try:
        yield
    except Exception:
        log.exception("traces: recording the %s's spans failed; the work itself went on", what)


def record_batch(
    model: Attributes,
    began: float,
    ended: float,
    size: int,
    padded_length: int,
    requests: Sequence[Context],
    phase: str | None = None,
) -> Timed | None:
    """One model run (``batch``): a new trace's root, since it serves many requests, with the model's
    attributes and the batch's shape, linked to the span of each request it served (``requests``)."""
    attributes = {
        **model,
        "inference.batch.size": size,
        "inference.batch.padded_length": padded_length,
        "inference.batch.padded_tokens": padded_length * size,
    }
    if phase is not None:
        attributes["inference.batch.phase"] = phase
    return record("batch", None, began, ended, attributes, [link_to(request) for request in requests])


def exemplar() -> dict[str, str] | None:
    """The current span's trace and span ids as a histogram exemplar's labels, when it is sampled."""
    if _recorder is None:
        return None
    ids = _sampled(None)
    if ids is None:
        return None
    return {"trace_id": format(ids.trace_id, "032x"), "span_id": format(ids.span_id, "016x")}
