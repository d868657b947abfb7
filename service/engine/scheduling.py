"""How urgent a request is and how long it may wait: set by the door for the request's task, read by both
engines when they admit and queue its work.

Three priority classes, most urgent first: ``high`` (0), ``normal`` (1, the default) and ``low`` (2).
Each queue takes the most urgent waiting work first, first in first out within a class. A waiting item
rises one class for every ``PRIORITY_AGING_S`` it has waited, so low-priority work is delayed under
load, never starved. When a queue is full, an item of a more urgent class displaces the least urgent,
newest waiting item, which is refused as a full queue is (429).

A tenant's key may carry a ceiling (``Ceiling``: the most urgent class it may ask for). Within a block
scheduled with one, a more urgent request is lowered to the ceiling, and the ceiling notes it, so the door
can say so in its answer.

A deadline (monotonic seconds) is the moment the client stops caring. An item still waiting then is
removed by its own timer and never computed; a generation running then ends with finish reason
``deadline``. Without one, an item waits at most the queue's own timeout.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

HIGH, NORMAL, LOW = 0, 1, 2
CLASSES = {"high": HIGH, "normal": NORMAL, "low": LOW}
NAMES = {number: name for name, number in CLASSES.items()}
PRIORITY_AGING_S = 5.0  # a waiting item rises one class per this many seconds


@dataclass
class Ceiling:
    """The most urgent class a caller may have (its key's ``max_priority``), and whether a request of its
    asked for more (``lowered_from``: the most urgent class asked for, None while none did)."""

    most_urgent: int
    lowered_from: int | None = None

    def apply(self, priority: int) -> int:
        if priority >= self.most_urgent:
            return priority
        self.lowered_from = priority if self.lowered_from is None else min(priority, self.lowered_from)
        return self.most_urgent


@dataclass(frozen=True)
class Scheduling:
    priority: int = NORMAL
    deadline: float | None = None  # time.monotonic() past which the client no longer wants the answer
    ceiling: Ceiling | None = None  # the caller's key's cap, shared by every block nested in its request

    def wait_limit(self, queue_timeout_s: float, now: float) -> tuple[float, bool]:
        """When a waiting item of this request expires, and whether that is the client's deadline (504)
        rather than the queue's own timeout (503)."""
        own = now + queue_timeout_s
        if self.deadline is not None and self.deadline <= own:
            return self.deadline, True
        return own, False


DEFAULT = Scheduling()
_current: ContextVar[Scheduling | None] = ContextVar("scheduling", default=None)


def current() -> Scheduling:
    """The running request's scheduling (the default outside a request)."""
    return _current.get() or DEFAULT


@contextlib.contextmanager
def scheduled(
    priority: int | None = None, timeout_s: float | None = None, ceiling: Ceiling | None = None
) -> Iterator[Scheduling]:
    """Within the block, the request's work is queued with ``priority`` (None: as set outside, else
    ``normal``) and a deadline ``timeout_s`` from now (None: as set outside, else none). ``ceiling`` (None:
    the one set outside, if any) lowers a more urgent ``priority`` to the most urgent class it allows."""
    outer = current()
    deadline = outer.deadline if timeout_s is None else time.monotonic() + timeout_s
    if outer.deadline is not None and deadline is not None:
        deadline = min(deadline, outer.deadline)
    ceiling = ceiling if ceiling is not None else outer.ceiling
    chosen = outer.priority if priority is None else priority
    if ceiling is not None:
        chosen = ceiling.apply(chosen)
    token = _current.set(Scheduling(chosen, deadline, ceiling))
    try:
        yield current()
    finally:
        _current.reset(token)


E = TypeVar("E")


class PriorityQueue(Generic[E]):
    """Waiting items by class, each class first in first out; ``key`` gives an item's (class, enqueued at).

    The next item is the one whose class, less one per ``aging_s`` it has waited, is the most urgent (the
    oldest first among equals): the head of some class, so order within a class never changes.
    """

    def __init__(self, key: Callable[[E], tuple[int, float]], aging_s: float = PRIORITY_AGING_S) -> None:
        self._key = key
        self._aging_s = aging_s
        self._classes: dict[int, deque[E]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __contains__(self, item: E) -> bool:
        return any(item in q for q in self._classes.values())

    def append(self, item: E) -> None:
        self._classes.setdefault(self._key(item)[0], deque()).append(item)
        self._size += 1

    def remove(self, item: E) -> None:
        self._classes[self._key(item)[0]].remove(item)
        self._size -= 1

    def _rank(self, item: E, now: float) -> tuple[int, float]:
        priority, enqueued_at = self._key(item)
        return priority - int((now - enqueued_at) / self._aging_s), enqueued_at

    def peek(self, now: float | None = None) -> E:
        now = time.monotonic() if now is None else now
        heads = [q[0] for q in self._classes.values() if q]
        return min(heads, key=lambda item: self._rank(item, now))

    def popleft(self, now: float | None = None) -> E:
        item = self.peek(now)
        self._classes[self._key(item)[0]].popleft()
        self._size -= 1
        return item

    def in_order(self, limit: int, now: float | None = None) -> list[E]:
        """The first ``limit`` items in the order they would be taken (the queue unchanged)."""
        now = time.monotonic() if now is None else now
        cursors = {c: 0 for c in self._classes}
        out: list[E] = []
        while len(out) < limit:
            heads = [(c, q[cursors[c]]) for c, q in self._classes.items() if cursors[c] < len(q)]
            if not heads:
                break
            c, item = min(heads, key=lambda pair: self._rank(pair[1], now))
            cursors[c] += 1
            out.append(item)
        return out

    def __iter__(self) -> Iterator[E]:
        return iter(self.in_order(self._size))

    def displaceable(self, priority: int) -> E | None:
        """The least urgent, newest waiting item of a class less urgent than ``priority`` (None: none)."""
        for c in sorted(self._classes, reverse=True):
            if c > priority and self._classes[c]:
                return self._classes[c][-1]
        return None

    def depth_by_class(self) -> dict[int, int]:
        return {c: len(q) for c, q in self._classes.items()}


class ClassObserver(Protocol):
    def on_class_depth(self, depths: dict[int, int]) -> None: ...

    def on_class_wait(self, priority: int, seconds: float) -> None: ...

    def on_class_expired(self, priority: int) -> None: ...

    def on_class_displaced(self, priority: int) -> None: ...


class NullClassObserver:
    """What the engines report by priority class (``metrics.py`` counts it); every hook optional."""

    def on_class_depth(self, depths: dict[int, int]) -> None:
        pass

    def on_class_wait(self, priority: int, seconds: float) -> None:
        pass

    def on_class_expired(self, priority: int) -> None:
        pass

    def on_class_displaced(self, priority: int) -> None:
        pass
