"""Dynamic batching for one model: a bounded queue and the task that turns it into batches.

Mirrors TEI's ``queue`` + batching task. Callers ``submit`` one item with its token
length and await the result; a single worker task forms batches under a size and a
padded-token budget, splits each batch into length-sorted sub-batches, and runs them
one after another in a dedicated thread (the model call blocks, but ONNX Runtime releases
the GIL, so the event loop keeps serving). Knows nothing of HTTP or of any model.

With traces on, each model run is one ``batch`` span, the root of its own trace, linked to the span of
every request it served and carrying the model's attributes (``span_attributes``); each request's trace
gets its ``queue`` wait, linked to the batch span it ended in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from opentelemetry.context import Context

from service.metadata import ANONYMOUS, RequestMeta
from service.observe import spans

from . import scheduling
from .errors import (
    BatcherClosedError,
    DeadlineExceededError,
    EngineError,
    InferenceError,
    QueueFullError,
    QueueTimeoutError,
)
from .worker import ModelWorker, Permit, with_defaults

__all__ = [
    "BatchPolicy",
    "BatcherClosedError",
    "BatcherObserver",
    "DynamicBatcher",
    "EngineError",
    "NullObserver",
    "QueueFullError",
    "QueueTimeoutError",
    "split_by_length",
]

log = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")
T = TypeVar("T")


@dataclass
class BatchPolicy:
    """Limits for one model's queue and batches.

    ``split_ratio`` / ``split_min_tokens`` control the length-sorted sub-batches (see
    ``split_by_length``); ``split_ratio <= 1`` keeps every formed batch whole.
    """

    max_batch_size: int
    max_batch_tokens: int
    max_queue_delay_ms: float
    max_queue_size: int
    queue_timeout_s: float
    split_ratio: float = 2.0
    split_min_tokens: int = 16

    def __post_init__(self) -> None:
        assert self.max_batch_size >= 1, "max_batch_size must be at least 1"
        assert self.max_batch_tokens >= 1, "max_batch_tokens must be at least 1"
        assert self.max_queue_delay_ms >= 0, "max_queue_delay_ms must be >= 0"
        assert self.max_queue_size >= 1, "max_queue_size must be at least 1"
        assert self.queue_timeout_s > 0, "queue_timeout_s must be positive"


class BatcherObserver(scheduling.ClassObserver, Protocol):
    """Where metrics hook in, without the engine depending on prometheus.

    Called on the event loop, at the point where each decision is made.
    Reject reasons: ``"queue_full"``, ``"timeout"``, ``"deadline"``, ``"cancelled"``, ``"closed"``.
    The ``on_class_*`` hooks (``scheduling.ClassObserver``) see the same by priority class.
    """

    def on_enqueue(self, depth: int) -> None: ...

    def on_dequeue(self, depth: int) -> None: ...

    def on_reject(self, reason: str) -> None: ...

    def on_batch(
        self, size: int, padded_tokens: int, queue_seconds: list[float], compute_seconds: float
    ) -> None: ...

    def on_in_flight(self, items: int) -> None: ...


class NullObserver(scheduling.NullClassObserver):
    """No-op observer; subclass it and override only the hooks you need."""

    def on_enqueue(self, depth: int) -> None:
        pass

    def on_dequeue(self, depth: int) -> None:
        pass

    def on_reject(self, reason: str) -> None:
        pass

    def on_batch(
        self, size: int, padded_tokens: int, queue_seconds: list[float], compute_seconds: float
    ) -> None:
        pass

    def on_in_flight(self, items: int) -> None:
        pass


def split_by_length(
    items: Sequence[T], cost: Callable[[T], int], ratio: float = 2.0, min_tokens: int = 16
) -> list[list[T]]:
    """Sort by cost and cut into runs of similar length, so short sequences are not padded to long ones.

    Rule: walking the items shortest first, a new run starts when an item's cost exceeds
    ``ratio * max(run_shortest, min_tokens)``. With ratio 2, at most half of a run's
    padded tokens is padding (unless everything is short); items up to
    ``ratio * min_tokens`` tokens long always stay together, because one more model call
    costs more than padding a handful of tokens. ``ratio <= 1`` disables splitting.
    """
    ordered = sorted(items, key=cost)
    if ratio <= 1:
        return [ordered] if ordered else []
    runs: list[list[T]] = []
    limit = -1.0
    for item in ordered:
        c = cost(item)
        if not runs or c > limit:
            runs.append([])
            limit = ratio * max(c, min_tokens)
        runs[-1].append(item)
    return runs


@dataclass(eq=False)
class _Entry(Generic[In, Out]):
    item: In
    cost: int
    future: asyncio.Future[Out]
    enqueued_at: float
    priority: int = scheduling.NORMAL
    most_urgent: int = scheduling.HIGH  # the class aging may lift it to: its key's ceiling
    expires_at: float = float("inf")  # the client's deadline, or the queue's own timeout
    client_deadline: bool = False  # expires_at is the client's: 504, not 503
    taken: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    trace: Context | None = field(default=None, repr=False)  # the request's, with traces on


class DynamicBatcher(ModelWorker, Generic[In, Out]):
    """Queue + batching task for one model.

    ``run_batch`` is blocking and returns one result or exception per item, in order. It
    runs on the worker's executor: one thread, so one model never runs two batches at
    once, and a slow model does not starve another model's batcher; with ``instances`` > 1,
    one thread per instance, each running its own sessions (``service.engine.instances``).
    """

    kind = "batcher"

    def __init__(
        self,
        name: str,
        policy: BatchPolicy,
        run_batch: Callable[[list[In]], Sequence[Out | BaseException]],
        observer: BatcherObserver | None = None,
        span_attributes: Mapping[str, str] | None = None,
        instances: int = 1,
    ) -> None:
        self._observer: BatcherObserver = with_defaults(observer, NullObserver)
        self._span_attributes = dict(span_attributes or {})  # the model's, on each batch span
        super().__init__(
            name,
            policy.max_queue_size,
            policy.max_batch_size,
            self._observer.on_reject,
            compute_threads=instances,
        )
        self._in_flight = 0  # items in the batches being computed
        self.policy = policy
        self._run_batch = run_batch
        self._queue: scheduling.PriorityQueue[_Entry[In, Out]] = scheduling.PriorityQueue(
            lambda e: (e.priority, e.enqueued_at), ceiling=lambda e: e.most_urgent
        )

    # --- public API (start, admit, retry_after_s, stop: ModelWorker) ------------------

    @property
    def waiting(self) -> int:
        """Entries waiting in the queue (not counting the batch being computed)."""
        return len(self._queue)

    def waiting_by_class(self) -> dict[int, int]:
        return self._queue.depth_by_class()

    async def submit(
        self, item: In, cost: int, permit: Permit | None = None, meta: RequestMeta = ANONYMOUS
    ) -> Out:
        """Queue ``item`` (``cost`` = its token length) and wait for its result.

        Never blocks on a full queue: raises ``QueueFullError`` at once, unless a ``permit`` holds the
        item's place. If the caller is cancelled while the entry still waits, the entry is removed and
        never reaches the model.
        """
        (result,) = await self.submit_all([item], [cost], permit, meta)
        return result

    async def submit_all(
        self,
        items: Sequence[In],
        costs: Sequence[int],
        permit: Permit | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> list[Out]:
        """Queue every item of one request and wait for all their results, in order: one future per item,
        and no task (a task per item cost the event loop more than the queueing itself).

        Each item needs its place: its ``permit``'s, else one taken now (``QueueFullError`` at once for the
        first that does not fit). If an item fails, or the caller is cancelled, the items still queued are
        withdrawn and never reach the model. ``meta``: the request's priority and deadline, and the span its
        items' queue waits are children of (its ``trace``)."""
        request, trace = meta.scheduling, meta.trace
        entries: list[_Entry[In, Out]] = []
        try:
            for item, cost in zip(items, costs, strict=True):
                entries.append(self._enqueue(item, cost, permit, request, trace))
            self._wakeup.set()
            if len(entries) == 1:
                return [await entries[0].future]
            return list(await asyncio.gather(*(e.future for e in entries)))
        except BaseException:
            for entry in entries:  # withdraw what still waits; a batch in flight skips a cancelled future
                self._drop_cancelled(entry)  # (a cancelled caller's awaited future is cancelled already)
                entry.future.cancel()
            raise
        finally:
            del entries  # a future holds the error raised here, whose traceback holds this frame: a cycle

    def _enqueue(
        self,
        item: In,
        cost: int,
        permit: Permit | None,
        request: scheduling.Scheduling,
        trace: Context | None,
    ) -> _Entry[In, Out]:
        """One item into the queue, with its place and the timer of its deadline (or the queue's timeout)."""
        self.check_open()
        if permit is None:
            self.admit(1, request.priority)
        else:
            permit.use()
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        expires_at, client_deadline = request.wait_limit(self.policy.queue_timeout_s, now)
        entry: _Entry[In, Out] = _Entry(
            item,
            cost,
            loop.create_future(),
            now,
            request.priority,
            request.most_urgent,
            expires_at,
            client_deadline,
        )
        entry.trace = trace
        entry.timer = loop.call_at(loop.time() + max(0.0, expires_at - now), self._expire, entry)
        self._queue.append(entry)
        self._observer.on_enqueue(len(self._queue))
        self._observer.on_class_depth(self._queue.depth_by_class())
        return entry

    # --- queue bookkeeping ----------------------------------------------------------

    def _remove(self, entry: _Entry[In, Out]) -> None:
        self._queue.remove(entry)
        if entry.timer is not None:
            entry.timer.cancel()
        self._observer.on_dequeue(len(self._queue))
        self._observer.on_class_depth(self._queue.depth_by_class())

    def _drop_cancelled(self, entry: _Entry[In, Out]) -> None:
        """The caller went away while its entry was still queued: drop it before the model sees it."""
        if entry.taken or entry not in self._queue:
            return
        self._remove(entry)
        self._count_cancelled(1)

    def _count_cancelled(self, n: int) -> None:
        for _ in range(n):
            self._observer.on_reject("cancelled")

    def _expire(self, entry: _Entry[In, Out]) -> None:
        """Timer callback at the entry's deadline (and a check while forming): fail it, never computed."""
        if entry.taken or entry.future.done():
            return
        self._remove(entry)
        waited = time.monotonic() - entry.enqueued_at
        if entry.client_deadline:
            self._observer.on_reject("deadline")
            self._observer.on_class_expired(entry.priority)
            entry.future.set_exception(DeadlineExceededError(self.name, waited))
        else:
            self._observer.on_reject("timeout")
            self._observer.on_class_expired(entry.priority)
            entry.future.set_exception(QueueTimeoutError(self.name, waited))

    def _displace(self, priority: int) -> bool:
        victim = self._queue.displaceable(priority)
        if victim is None:
            return False
        self._remove(victim)
        self._observer.on_reject("queue_full")
        self._observer.on_class_displaced(victim.priority)
        victim.future.set_exception(
            QueueFullError(self.name, len(self._queue), self.retry_after_s(), displaced=True)
        )
        return True

    def _fail_pending(self, error: BaseException, drained: bool) -> None:
        """Fail what still waits; the batch in flight is failed by ``_execute`` when the loop is cancelled."""
        while self._queue:
            entry = self._queue.peek()
            self._remove(entry)
            if not entry.future.done():
                self._observer.on_reject("closed")
                entry.future.set_exception(error)

    # --- batching task -----------------------------------------------------------------

    async def _run(self) -> None:
        """Form a batch whenever an instance is free: one at a time with one instance, else up to one per
        instance at once. A batch is formed only when it can start, from whatever waits by then."""
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                if len(running) >= self.compute_threads:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if not await self._wait_for_batch():
                    break
                batch = self._take_batch()
                if not batch:
                    continue
                if self.compute_threads == 1:
                    await self._execute_guarded(batch)
                    continue
                task = asyncio.get_running_loop().create_task(self._execute_guarded(batch))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(running)
        finally:  # cancelled by stop() past its deadline: so are the batches in flight, which fail theirs
            for task in list(running):
                task.cancel()
            if running:
                await asyncio.wait(running)

    async def _execute_guarded(self, batch: list[_Entry[In, Out]]) -> None:
        try:
            await self._execute(batch)
        except Exception as exc:  # a bug here must not stop the model from serving
            log.exception("batcher %s: unexpected error while running a batch", self.name)
            self._fail(batch, EngineError(f"internal batching error: {exc!r}"))

    async def _wait_for_batch(self) -> bool:
        """Wait until a batch is worth forming; False once closed with nothing left to do."""
        delay_s = self.policy.max_queue_delay_ms / 1000.0
        while True:
            if not self._queue:
                if self._closed:
                    return False
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._closed or self._queue_fills_a_batch():
                return True
            remaining = self._queue.peek().enqueued_at + delay_s - time.monotonic()
            if remaining <= 0:
                return True
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)

    def _queue_fills_a_batch(self) -> bool:
        """No point waiting for more once the head of the queue already fills the size or token budget."""
        head = self._queue.in_order(self.policy.max_batch_size)
        if len(head) >= self.policy.max_batch_size:
            return True
        return max(e.cost for e in head) * len(head) >= self.policy.max_batch_tokens

    def _take_batch(self) -> list[_Entry[In, Out]]:
        """Take entries oldest-first while ``max(cost) * count`` fits the budget (a lone oversized entry still goes)."""
        now = time.monotonic()
        batch: list[_Entry[In, Out]] = []
        max_cost = 0
        while self._queue and len(batch) < self.policy.max_batch_size:
            entry = self._queue.peek(now)
            if entry.future.done():
                # Its caller was cancelled (its future with it) and its clean-up has not run yet: on a busy
                # loop a batch can be formed in between. Dropped here as the clean-up would have, with the
                # gauges told (a bare removal left the queue depth reported stale once the queue emptied).
                self._drop_cancelled(entry)
                continue
            if now >= entry.expires_at:
                self._expire(entry)
                continue
            padded = max(max_cost, entry.cost) * (len(batch) + 1)
            if batch and padded > self.policy.max_batch_tokens:
                break
            self._queue.remove(entry)
            if entry.timer is not None:
                entry.timer.cancel()
            entry.taken = True
            max_cost = max(max_cost, entry.cost)
            batch.append(entry)
        if batch:
            self._observer.on_dequeue(len(self._queue))
            self._observer.on_class_depth(self._queue.depth_by_class())
            for entry in batch:
                self._observer.on_class_wait(entry.priority, now - entry.enqueued_at)
        return batch

    async def _execute(self, batch: list[_Entry[In, Out]]) -> None:
        """Run the batch's length-sorted sub-batches back to back in one trip to the compute thread.

        The thread does not wait for the event loop between sub-batches: under load the loop can be
        slow to resume a coroutine (it is busy answering other requests), and one wait per sub-batch
        would leave the model idle for each. Each sub-batch's answers go back to the loop as soon as
        it is done, so short items do not wait for the long sub-batches after them.
        """
        started = time.monotonic()
        self._in_flight += len(batch)
        self._observer.on_in_flight(self._in_flight)
        subs = split_by_length(batch, lambda e: e.cost, self.policy.split_ratio, self.policy.split_min_tokens)
        try:
            await self.in_compute_thread(self._compute, asyncio.get_running_loop(), subs)
        except asyncio.CancelledError:  # stop() ran out of time
            self._fail(batch, BatcherClosedError(self.name, "stopped before the batch finished"))
            raise
        finally:
            self._in_flight -= len(batch)
            self._observer.on_in_flight(self._in_flight)
        self._record(time.monotonic() - started)

    def _compute(self, loop: asyncio.AbstractEventLoop, subs: list[list[_Entry[In, Out]]]) -> None:
        """On the compute thread: each sub-batch's model call, its answers handed to the loop as it ends."""
        for sub in subs:
            # Callers cancelled while an earlier sub-batch ran still never reach the model.
            live = [e for e in sub if not e.future.done()]
            started = time.monotonic()
            results = self._call(live) if live else []
            if len(live) > 1 and all(isinstance(r, InferenceError) for r in results):
                # The whole call failed: find the culprit(s) by running each item alone, so one bad input
                # fails its own request and the others in the batch still get their answers.
                log.warning(
                    "batcher %s: a batch of %d failed; retrying its items one by one", self.name, len(live)
                )
                results = [self._call([entry])[0] for entry in live]
            with contextlib.suppress(RuntimeError):  # the loop closed while a stopped batch finished
                loop.call_soon_threadsafe(self._deliver, live, results, started, len(sub) - len(live))

    def _deliver(
        self,
        entries: list[_Entry[In, Out]],
        results: Sequence[Out | BaseException],
        started: float,
        cancelled: int,
    ) -> None:
        """On the loop: one sub-batch's answers to their callers (a caller that left meanwhile is skipped)."""
        self._count_cancelled(cancelled)
        if not entries:
            return
        ended = time.monotonic()
        compute_seconds = ended - started  # until the loop has the results, as the metric says
        longest = max(e.cost for e in entries)
        padded = longest * len(entries)
        self._observer.on_batch(
            len(entries), padded, [started - e.enqueued_at for e in entries], compute_seconds
        )
        for entry, result in zip(entries, results, strict=True):
            if entry.future.done():  # caller left during the computation
                continue
            if isinstance(result, BaseException):
                entry.future.set_exception(result)
            else:
                entry.future.set_result(result)
        if spans.on():
            with spans.guard("batch"):
                self._trace(entries, started, ended, longest)

    def _trace(self, entries: list[_Entry[In, Out]], started: float, ended: float, longest: int) -> None:
        """The model run's span, linked to every traced request in it, and each request's queue wait, linked
        to the run, in its own trace."""
        traced = [(e, e.trace) for e in entries if e.trace is not None]
        if not traced:
            return
        batch = spans.record_batch(
            self._span_attributes, started, ended, len(entries), longest, [trace for _, trace in traced]
        )
        if batch is None:
            return
        to_batch = [spans.link_to(batch)]
        for entry, trace in traced:
            spans.record(
                "queue",
                trace,
                entry.enqueued_at,
                started,
                {"inference.priority": entry.priority},
                to_batch,
            )

    def _call(self, entries: list[_Entry[In, Out]]) -> Sequence[Out | BaseException]:
        """One model call, on the compute thread; if it raises, every item of it gets an InferenceError
        (logged once, with traceback)."""
        try:
            results = self._run_batch([e.item for e in entries])
        except Exception as exc:
            log.error("batcher %s: model call on %d item(s) failed", self.name, len(entries), exc_info=exc)
            error = InferenceError(self.name, exc)
            error.__cause__ = exc
            return [error] * len(entries)
        if len(results) != len(entries):
            raise EngineError(f"run_batch returned {len(results)} results for {len(entries)} items")
        return results

    def _fail(self, entries: list[_Entry[In, Out]], error: BaseException) -> None:
        for entry in entries:
            if not entry.future.done():
                entry.future.set_exception(error)
