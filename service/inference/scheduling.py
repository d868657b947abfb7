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

from service.engine.scheduling import CLASSES, HIGH, LOW, NAMES, NORMAL, current, scheduled
from service.errors import InvalidInputError

MAX_TIMEOUT_S = 3600.0

__all__ = [
    "CLASSES",
    "LOW",
    "NAMES",
    "current",
    "priority_named",
    "priority_of_triton",
    "priority_of_vllm",
    "scheduled",
    "timeout_of",
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
    """A timeout in ``unit_s`` seconds (1e-3: milliseconds, 1e-6: microseconds), positive, at most an hour."""
    n = _integer(value, field)
    seconds = n * unit_s
    if n <= 0 or seconds > MAX_TIMEOUT_S:
        raise InvalidInputError(
            f"must be positive and at most {MAX_TIMEOUT_S:.0f} s, got {n}", field, "out_of_range"
        )
    return seconds
