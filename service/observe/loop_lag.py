"""How late this process's event loop runs what is due: the signal behind shedding low-priority work.

Every request's HTTP parsing, JSON, validation and answer run on one event loop. When more arrives than
it can turn round, callbacks wait their turn and every request, however urgent, waits with them: a
queue the model's priority order cannot reach. ``LoopLag`` measures that wait the way Node's
``toobusy`` and Go's scheduler-latency metrics do: a timer due every ``interval_s`` notes how late it
fired. ``lag_s`` is the latest lateness, kept up to the worst of the recent ones (it halves each tick
the loop is on time), so one late tick is enough to start shedding and a few quiet ones to stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

INTERVAL_S = 0.01  # one tick every 10 ms: ~100 cheap callbacks a second


class LoopLag:
    def __init__(
        self, interval_s: float = INTERVAL_S, on_sample: Callable[[float], None] | None = None
    ) -> None:
        self.interval_s = interval_s
        self.lag_s = 0.0
        self._on_sample = on_sample
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        """Start ticking on the running loop; idempotent."""
        if self._handle is None:
            self._schedule(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = loop.time() + self.interval_s
        self._handle = loop.call_at(self._due, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        late = max(0.0, loop.time() - self._due)
        self.lag_s = max(late, self.lag_s / 2)
        if self._on_sample is not None:
            self._on_sample(late)
        self._schedule(loop)
