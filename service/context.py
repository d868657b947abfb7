"""What the current request is, for log lines and metrics only, without passing it through every call.

The doors open a ``RequestContext`` per request (``bind``: the HTTP middleware ``observe.py``, the gRPC
servicer); the model registry notes which model answers it (``note_model``), so request metrics and log
lines carry the model even when the request fails. The context object is shared by reference, so a note
made inside a task spawned for the request is seen by the middleware that opened it.

Nothing reads it to decide anything: what a request may do and how it is queued travels in its
``RequestMeta`` (``service/metadata.py``), passed in every signature (``tests/test_layering.py`` checks).
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass


@dataclass
class RequestContext:
    request_id: str = ""
    model: str = ""


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "request_context", default=None
)


def bind(context: RequestContext) -> contextvars.Token[RequestContext | None]:
    return _current.set(context)


def unbind(token: contextvars.Token[RequestContext | None]) -> None:
    _current.reset(token)


def current() -> RequestContext | None:
    return _current.get()


def note_model(name: str) -> None:
    context = _current.get()
    if context is not None:
        context.model = name


class RequestContextFilter(logging.Filter):
    """Adds ``request_id`` and ``model`` to every log record ("-" outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _current.get()
        record.request_id = context.request_id if context and context.request_id else "-"
        record.model = context.model if context and context.model else "-"
        return True
