"""The service's log lines: one record is one line, whatever a client sent.

A client chooses much of what a log line holds: its request id, a model name, the text inside an
error message. A newline in any of it would start a line of the client's making, with a timestamp
and a level of its choosing. So every record's message (and its request id and model fields) is
written with control characters escaped (``\\n`` as the two characters ``\\`` ``n``, ESC as ``\\x1b``,
so terminals do not act on them either), and the lines of a traceback are indented. A line that
starts in column 0 is always a record this formatter began, with its own timestamp.

Request ids themselves follow one rule on every door (``api/http/request_id.py:client_request_id``):
the client's id when it is short and made of safe characters, else a new one.

``LOG_FORMAT=json`` writes each record as one JSON object on one line (python-json-logger; JSON escapes
every control character), with the request id, the model, and the ``trace_id`` and ``span_id`` of the
span current when it was logged (empty outside a traced request), so a log line leads to its trace.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from service.context import RequestContextFilter
from service.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s %(model)s]: %(message)s"

# C0 controls (tab aside), DEL, C1 controls, and Unicode's own line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def one_line(text: str) -> str:
    """``text`` with every control character escaped: it cannot end the line it is written on."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


class LogLineFormatter(logging.Formatter):
    """``logging.Formatter`` whose records cannot break into lines a client wrote (module docstring)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        for field in ("request_id", "model"):
            value = getattr(record, field, None)
            if isinstance(value, str):
                setattr(record, field, one_line(value))
        return super().formatMessage(record)

    def formatException(self, ei: object) -> str:
        return _indented(super().formatException(ei))  # type: ignore[arg-type]

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (lowercase hex, as W3C ``traceparent`` writes them) of the span
    current when the record was made; empty strings when none is."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        else:
            record.trace_id = record.span_id = ""
        return True


JSON_FIELDS = ("asctime", "levelname", "name", "message", "request_id", "model", "trace_id", "span_id")


def json_formatter() -> JsonFormatter:
    """One JSON object per record: time, level, logger, message, request id, model, trace and span ids."""
    return JsonFormatter(
        list(JSON_FIELDS), rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}
    )


def log_handler(settings: Settings) -> logging.Handler:
    """A handler on stderr in ``LOG_FORMAT``, with the request's context on every record."""
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter() if settings.log_format == "json" else LogLineFormatter(LOG_FORMAT))
    handler.addFilter(RequestContextFilter())
    handler.addFilter(TraceContextFilter())
    return handler


def json_log_config(settings: Settings) -> dict[str, Any]:
    """uvicorn's ``log_config`` for ``LOG_FORMAT=json``: the root logger gets the JSON handler, and uvicorn's
    own loggers hand their records to it instead of writing text of their own."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"json": {"()": log_handler, "settings": settings}},
        "root": {"handlers": ["json"], "level": "INFO"},
        "loggers": {
            name: {"handlers": [], "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def configure_logging(settings: Settings) -> None:
    """Our loggers' level; a handler (with the request id and model) only when nobody configured one."""
    level = "DEBUG" if settings.log_level == "trace" else settings.log_level.upper()
    logging.getLogger("service").setLevel(level)
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(log_handler(settings))
