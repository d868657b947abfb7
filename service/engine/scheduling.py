"""How urgent a request is and how long it may wait: set by the door in the request's metadata
(``service/metadata.py``: ``RequestMeta.scheduling``), and read by both engines, which are given it when
they admit and queue its work.

Three priority classes, most urgent first: ``high`` (0), ``normal`` (1, the default) and ``low`` (2).
Each queue takes the most urgent waiting work first, first in first out within a class (continuous
batching takes a class's sequences round robin by request instead, so one request's many sequences never
hold up another's). A waiting item rises one class for every ``PRIORITY_AGING_S`` it has waited, so
low-priority work is delayed under load, never starved; it never rises above its key's ceiling. When a queue is full, an item of a more urgent class displaces the least urgent,
newest waiting item, which is refused as a full queue is (429).

A tenant's key may carry a ceiling (``Ceiling``: the most urgent class it may ask for). Once a request's
metadata carries one, a more urgent class asked for later (a header, a body field) is lowered to the
ceiling (``RequestMeta.scheduled``), and the ceiling notes it, so the door can say so in its answer. Aging stops at the ceiling too (``Scheduling.most_urgent``).

A deadline (monotonic seconds) is the moment the client stops caring. An item still waiting then is
removed by its own timer and never computed; a generation running then ends with finish reason
``deadline``. Without one, an item waits at most the queue's own timeout.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
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

    @property
    def most_urgent(self) -> int:
        """The most urgent class this request's waiting work may reach by aging: its key's ceiling, or
        ``high`` without one."""
        return self.ceiling.most_urgent if self.ceiling is not None else HIGH

    def wait_limit(self, queue_timeout_s: float, now: float) -> tuple[float, bool]:
        """When a waiting item of this request expires, and whether that is the client's deadline (504)
        rather than the queue's own timeout (503)."""
        own = now + queue_timeout_s
        if self.deadline is not None and self.deadline <= own:
            return self.deadline, True
        return own, False


DEFAULT = Scheduling()


class Share:
    """One request's part in a shared queue (its sequences hold it): how many of its items were taken
    so far, so that taking round robin by request can favour the request served least."""

    __slots__ = ("__weakref__", "taken")

    def __init__(self) -> None:
        self.taken = 0


E = TypeVar("E")


class PriorityQueue(Generic[E]):
    """Waiting items by class, each class first in first out; ``key`` gives an item's (class, enqueued at)
    and ``ceiling`` the most urgent class it may age to (None: any).

    An item's rank is its class less one per ``aging_s`` it has waited, but never above its ceiling. The
    next item is the most urgent by rank (the oldest first among equals), always the head of its class's
    items of one ceiling (kept apart so that one never hides another's aging): order within a class never
    changes, unless ``popleft`` is given a ``share`` to order the items of the most urgent rank by.
    """

    def __init__(
        self,
        key: Callable[[E], tuple[int, float]],
        aging_s: float = PRIORITY_AGING_S,
        ceiling: Callable[[E], int] | None = None,
    ) -> None:
        self._key = key
        self._aging_s = aging_s
        self._ceiling = ceiling
        self._queues: dict[tuple[int, int], deque[E]] = {}  # by (class, the most urgent it may age to)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __contains__(self, item: E) -> bool:
        return any(item in q for q in self._queues.values())

    def _slot(self, item: E) -> tuple[int, int]:
        priority = self._key(item)[0]
        return priority, HIGH if self._ceiling is None else min(self._ceiling(item), priority)

    def append(self, item: E) -> None:
        self._queues.setdefault(self._slot(item), deque()).append(item)
        self._size += 1

    def remove(self, item: E) -> None:
        self._queues[self._slot(item)].remove(item)
        self._size -= 1

    def _rank(self, item: E, now: float) -> tuple[int, float]:
        priority, enqueued_at = self._key(item)
        floor = self._slot(item)[1]
        return max(priority - int((now - enqueued_at) / self._aging_s), floor), enqueued_at

    def peek(self, now: float | None = None) -> E:
        now = time.monotonic() if now is None else now
        heads = [q[0] for q in self._queues.values() if q]
        return min(heads, key=lambda item: self._rank(item, now))

    def popleft(self, now: float | None = None, share: Callable[[E], tuple[int, int]] | None = None) -> E:
        """Remove and return the next item; with ``share``, of the items whose class and ceiling have a
        head of the most urgent rank, the one of least ``share`` (the oldest first among equals)."""
        now = time.monotonic() if now is None else now
        item = self.peek(now)
        if share is not None:
            best = self._rank(item, now)[0]
            tied = [q for q in self._queues.values() if q and self._rank(q[0], now)[0] == best]
            item = min((i for q in tied for i in q), key=lambda i: (share(i), self._key(i)[1]))
        self._queues[self._slot(item)].remove(item)
        self._size -= 1
        return item

    def in_order(self, limit: int, now: float | None = None) -> list[E]:
        """The first ``limit`` items in the order they would be taken (the queue unchanged)."""
        now = time.monotonic() if now is None else now
        cursors = {s: 0 for s in self._queues}
        out: list[E] = []
        while len(out) < limit:
            heads = [(s, q[cursors[s]]) for s, q in self._queues.items() if cursors[s] < len(q)]
            if not heads:
                break
            s, item = min(heads, key=lambda pair: self._rank(pair[1], now))
            cursors[s] += 1
            out.append(item)
        return out

    def __iter__(self) -> Iterator[E]:
        return iter(self.in_order(self._size))

    def displaceable(self, priority: int) -> E | None:
        """The least urgent, newest waiting item of a class less urgent than ``priority`` (None: none)."""
        for c in sorted({c for c, _ in self._queues}, reverse=True):
            tails = [q[-1] for (k, _), q in self._queues.items() if k == c and q]
            if c > priority and tails:
                return max(tails, key=lambda item: self._key(item)[1])
        return None

    def depth_by_class(self) -> dict[int, int]:
        depths: dict[int, int] = {}
        for (c, _), q in self._queues.items():
            depths[c] = depths.get(c, 0) + len(q)
        return depths


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
