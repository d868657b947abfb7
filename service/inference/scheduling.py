"""A request's priority class and deadline as each protocol says them, read once for every door (the
engines' rule is ``engine/scheduling.py``: three classes, aging, displacement, deadlines).

- REST: ``priority`` (``high`` | ``normal`` | ``low``) and ``timeout_ms`` in the body, or the headers
  ``X-Request-Priority`` and ``X-Request-Timeout-Ms``.
- OpenAI: ``priority``, an integer as vLLM takes it (lower is more urgent, 0 the default), and
  ``timeout_ms``.
- Open Inference Protocol: ``parameters.priority`` as Triton takes it (0: the default level; 1 the most
  urgent; larger, less urgent) and ``parameters.timeout`` in microseconds; over gRPC, the call's own
  deadline too.
"""

from __future__ import annotations

import re

from service.engine.scheduling import CLASSES, HIGH, LOW, NAMES, NORMAL, Ceiling
from service.errors import InvalidInputError

MAX_TIMEOUT_S = 3600.0

__all__ = [
    "CLASSES",
    "LOW",
    "NAMES",
    "Ceiling",
    "header_integer",
    "priority_named",
    "priority_of_triton",
    "priority_of_vllm",
    "shown",
    "timeout_of",
    "whole_number",
]


def priority_named(value: object, field: str) -> int:
    """``high`` | ``normal`` | ``low`` (REST, the header)."""
    if isinstance(value, str) and value.strip().lower() in CLASSES:
        return CLASSES[value.strip().lower()]
    raise InvalidInputError(f"must be one of {', '.join(CLASSES)}, got {value!r}", field, "invalid_priority")


def _integer(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"must be an integer, got {value!r}", field, "type_error")
    return value


def priority_of_vllm(value: object, field: str) -> int:
    """vLLM's integer priority: below 0 is high, 0 normal, above 0 low."""
    n = _integer(value, field)
    return HIGH if n < 0 else NORMAL if n == 0 else LOW


def priority_of_triton(value: object, field: str) -> int:
    """Triton's priority level: 0 the default (normal), 1 high, 2 normal, 3 and above low."""
    n = _integer(value, field)
    if n < 0:
        raise InvalidInputError(f"must be 0 or more, got {n}", field, "out_of_range")
    return {0: NORMAL, 1: HIGH, 2: NORMAL}.get(n, LOW)


def timeout_of(value: object, field: str, unit_s: float) -> float:
    """A timeout in ``unit_s`` seconds (1e-3: milliseconds, 1e-6: microseconds), positive, at most an hour.
    The range is checked on the integer, before any conversion: no integer, however long, overflows."""
    n = _integer(value, field)
    if n <= 0 or n > round(MAX_TIMEOUT_S / unit_s):
        shown = str(n) if -(10**12) < n < 10**12 else f"a {len(str(abs(n)))}-digit number"
        raise InvalidInputError(
            f"must be positive and at most {MAX_TIMEOUT_S:.0f} s, got {shown}", field, "out_of_range"
        )
    return n * unit_s


# A whole number in text (a header's, a JSON key's): ASCII digits only (``str.isdigit`` admits "²" and
# other scripts' digits, some of which ``int`` refuses and some it reads), short enough that no conversion can fail.
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


def whole_number(text: str) -> int | None:
    """``text`` (spaces around allowed) as a non-negative whole number of 1-18 ASCII digits, else None."""
    digits = text.strip()
    return int(digits) if _WHOLE_NUMBER.fullmatch(digits) else None


def shown(text: str) -> str:
    """A client's text as an error message quotes it: at most 32 characters."""
    return repr(text if len(text) <= 32 else text[:32] + "...")


def header_integer(text: str, field: str) -> int:
    """A header's value as a non-negative whole number (ASCII digits, spaces around allowed), else a 422
    naming ``field``."""
    n = whole_number(text)
    if n is None:
        raise InvalidInputError(
            f"must be a whole number of milliseconds, got {shown(text.strip())}", field, "type_error"
        )
    return n
