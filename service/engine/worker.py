"""What both engines share: one loop task and its compute threads per model, a bounded queue, a deadline to stop.

``DynamicBatcher`` (encoders, the translator) and ``GenerationEngine`` (GPT)
differ in what they queue and how they turn the queue into model calls; they
start, admit (a request's ``Permit``, taken once), refuse, estimate Retry-After and stop the same way, here. Every
model call runs in the worker's own executor, so the event loop stays free while ONNX Runtime works: one
thread, so one model never runs two calls at once, unless the model has several instances
(``MODEL_INSTANCES``, ``service.engine.instances``): then one thread per instance, each on its own sessions.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.metadata import ANONYMOUS, RequestMeta

from . import instances, scheduling
from .errors import BatcherClosedError, QueueFullError

log = logging.getLogger(__name__)

H = TypeVar("H")

# Weight of the newest duration in the moving average behind Retry-After.
EWMA_ALPHA = 0.2


def with_defaults(observer: object | None, null: type[H]) -> H:
    """``null()`` with each hook replaced by the observer's own where it has one: every hook is optional."""
    hooks = null()
    if observer is not None:
        for name in dir(null):
            if name.startswith("on_") and hasattr(observer, name):
                setattr(hooks, name, getattr(observer, name))
    return hooks


class Permit:
    """Places a request holds in a model's queue, from before its preprocessing until its items are queued.

    Taken once, for all the request's items (``ModelWorker.reserve``): a full queue refuses the request
    before tokenization or decoding is paid for, and the items it covers are then queued with no check
    of their own (``submit(..., permit)``), all of them or none. A context manager: on exit, the places
    it did not use go back.

    A more urgent request that finds the queue full may take a place from a less urgent permit
    (``revoke``): that request is then refused as displaced (429) when it next queues an item.
    """

    def __init__(self, worker: ModelWorker, count: int, priority: int = scheduling.NORMAL) -> None:
        self._worker = worker
        self.count = count
        self.priority = priority
        self.revoked = 0  # places a more urgent request took

    def check(self) -> None:
        """Raise QueueFullError (displaced) if a more urgent request took one of this permit's places."""
        if self.revoked:
            self.revoked = 0
            self._worker._forget(self)
            raise QueueFullError(
                self._worker.name, self._worker.waiting, self._worker.retry_after_s(), displaced=True
            )

    def use(self) -> None:
        """One item of the request is queued: its place is the queue's now, no longer the permit's."""
        self.check()
        assert self.count > 0, "every item the permit covers is already queued"
        self.count -= 1
        self._worker._reserved -= 1
        if not self.count:
            self._worker._forget(self)

    def revoke(self) -> None:
        """A more urgent request takes one of the places (the permit still holds one)."""
        self.count -= 1
        self.revoked += 1
        self._worker._reserved -= 1
        if not self.count:
            self._worker._forget(self)

    def release(self) -> None:
        self._worker._reserved -= self.count
        self.count = 0
        self._worker._forget(self)

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ModelWorker(ABC):
    """Start, admission, Retry-After and stop of one model's engine; subclasses supply the loop.

    ``kind`` names the engine in thread, task and log names (``batcher-vit``).
    Subclasses implement ``_run`` (the loop, until closed with nothing left),
    ``waiting`` (queued, not yet taken), and ``_fail_pending`` (fail what waits
    or runs when stopping); they call ``_record(seconds)`` after each unit of
    work the Retry-After estimate counts in (a batch, a sequence).
    """

    kind = "worker"

    def __init__(
        self,
        name: str,
        max_queue_size: int,
        per_round: int,
        on_reject: Callable[[str], None],
        compute_threads: int = 1,
    ):
        assert max_queue_size >= 1, "max_queue_size must be at least 1"
        assert per_round >= 1, "per_round must be at least 1"
        assert compute_threads >= 1, "compute_threads must be at least 1"
        self.name = name
        self.compute_threads = (
            compute_threads  # model calls at once: one per instance (service.engine.instances)
        )
        self.max_queue_size = max_queue_size
        self._per_round = per_round  # queued items one unit of work takes (batch size, running sequences)
        self._on_reject = on_reject
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._avg_unit_s = 0.0
        self._reserved = 0  # places held by permits whose items are not queued yet
        # those permits by class, oldest first: a refusal looks only at the classes it may take from
        self._permits: dict[int, dict[Permit, None]] = {c: {} for c in scheduling.NAMES}

    @property
    @abstractmethod
    def waiting(self) -> int:
        """Items queued and not yet taken."""

    @abstractmethod
    def waiting_by_class(self) -> dict[int, int]:
        """Items queued and not yet taken, by priority class."""

    @abstractmethod
    async def _run(self) -> None:
        """The loop: until closed with nothing left to do."""

    @abstractmethod
    def _fail_pending(self, error: BaseException, drained: bool) -> None:
        """Fail what is still waiting (and, once ``drained``, what still runs) with ``error``."""

    @abstractmethod
    def _displace(self, priority: int) -> bool:
        """Refuse the least urgent, newest waiting item of a class less urgent than ``priority`` with a
        QueueFullError (it was displaced); False when there is none."""

    @property
    def accepting(self) -> bool:
        return self._worker is not None and not self._closed

    async def start(self) -> None:
        """Start the loop on the running event loop; idempotent."""
        if self._closed:
            raise BatcherClosedError(self.name, "stopped")
        if self._worker is not None:
            return
        label = f"{self.kind}-{self.name}"
        self._executor = ThreadPoolExecutor(
            max_workers=self.compute_threads, thread_name_prefix=label, initializer=instances.binder()
        )
        self._worker = asyncio.get_running_loop().create_task(self._run(), name=label)

    def check_open(self) -> None:
        """Raise BatcherClosedError (and count the refusal) unless the worker takes requests now."""
        if not self.accepting:
            self._on_reject("closed")
            raise BatcherClosedError(self.name, "not started" if self._worker is None else "shutting down")

    def admit(self, count: int, priority: int = scheduling.NORMAL) -> None:
        """Raise QueueFullError (and count the refusal) unless ``count`` more items fit the queue now.

        The check of an item queued without a permit. A closed worker is left to ``check_open`` at
        submission, which says so.
        """
        if not self.accepting:
            return
        while self.waiting + self._reserved + count > self.max_queue_size:
            # a more urgent request takes the place of a less urgent one: queued, else still reserved
            if not (self._displace(priority) or self._revoke(priority)):
                self._on_reject("queue_full")
                raise QueueFullError(self.name, self.waiting, self.retry_after_s())

    def _revoke(self, priority: int) -> bool:
        """Take one place from the least urgent, newest permit of a class less urgent than ``priority``."""
        for cls in sorted((c for c in self._permits if c > priority), reverse=True):
            if self._permits[cls]:
                victim = next(reversed(self._permits[cls]))  # every permit here still holds a place
                break
        else:
            return False
        victim.revoke()
        self._on_reject("queue_full")
        return True

    def reserve(self, count: int, meta: RequestMeta = ANONYMOUS) -> Permit:
        """``count`` places for one request's items (``meta``: its priority class), taken now, or
        QueueFullError: its one admission."""
        priority = meta.scheduling.priority
        self.admit(count, priority)
        self._reserved += count
        permit = Permit(self, count, priority)
        if count:
            self._permits.setdefault(permit.priority, {})[permit] = None
        return permit

    def _forget(self, permit: Permit) -> None:
        self._permits[permit.priority].pop(permit, None)

    def retry_after_s(self) -> int:
        """Whole seconds until a place likely frees: rounds of work ahead x recent round time, >= 1."""
        rounds_ahead = math.ceil((self.waiting + 1) / (self._per_round * self.compute_threads))
        return max(1, math.ceil(rounds_ahead * self._avg_unit_s))

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None:
        """Stop accepting; finish waiting and running work (``drain``) within ``timeout_s``.

        Without ``drain`` what waits fails with BatcherClosedError at once; whatever
        is unfinished after the deadline fails the same way. The model call in
        flight cannot be interrupted; its thread finishes on its own.
        """
        self._closed = True
        if not drain:
            self._fail_pending(BatcherClosedError(self.name), drained=False)
        self._wakeup.set()
        if self._worker is not None and not self._worker.done():
            _, pending = await asyncio.wait({self._worker}, timeout=timeout_s)
            if pending:
                log.warning(
                    "%s %s: stop timed out after %.1fs, failing the rest", self.kind, self.name, timeout_s
                )
                self._worker.cancel()
                await asyncio.wait({self._worker})
        self._fail_pending(BatcherClosedError(self.name, "stopped before the work finished"), drained=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def in_compute_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this worker's compute thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _record(self, seconds: float) -> None:
        """One unit of work took ``seconds``: update the moving average behind Retry-After."""
        self._avg_unit_s = (
            seconds if self._avg_unit_s == 0 else EWMA_ALPHA * seconds + (1 - EWMA_ALPHA) * self._avg_unit_s
        )
