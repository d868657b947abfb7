"""JSON a client sent, decoded in one place: a value, or a 400 (``malformed_json``) saying what is wrong.

Every way a client's JSON can fail to decode is caught here, whatever carries it (a request body, the
v2 binary request's JSON header, a v2 ``stop`` parameter holding a JSON list): msgspec's own decode
error, invalid UTF-8 inside a string (``UnicodeDecodeError``), and nesting deeper than the decoder
can follow (``RecursionError``). The last two are not ``ValueError``s a caller would think to catch,
and each once reached a 500.
"""

from __future__ import annotations

from typing import Any

import msgspec

from service.errors import MalformedBodyError


def malformed(exc: Exception, what: str = "JSON", field: str | None = None) -> MalformedBodyError:
    """The 400 for a decode failure ``exc`` of ``what`` (``the inference header``, ...)."""
    if isinstance(exc, UnicodeDecodeError):
        reason = f"not valid UTF-8 at byte {exc.start} ({exc.reason})"
    elif isinstance(exc, RecursionError):
        reason = "nested too deeply"
    else:
        reason = str(exc).removeprefix("JSON is malformed: ")
    # a body says so as Litestar does ("JSON is malformed: ..."); a part of one names itself
    message = f"JSON is malformed: {reason}" if what == "JSON" else f"{what} is not valid JSON: {reason}"
    return MalformedBodyError(message, "malformed_json", field=field)


# What decoding a client's JSON can raise besides a value (``malformed`` turns each into a 400).
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError)


def parse_client_json(raw: bytes | str, what: str = "JSON", field: str | None = None) -> Any:
    """``raw`` decoded, or a ``MalformedBodyError`` naming ``what`` (and ``field``)."""
    try:
        return msgspec.json.decode(raw)
    except DECODE_ERRORS as exc:
        raise malformed(exc, what, field) from exc
