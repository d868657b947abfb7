"""DynamicBatcher: batch limits, ordering, backpressure, cancellation, failures, shutdown.

A fake model records the batches it receives. A gate (threading.Event) holds the model
busy on its first batch so the queue fills deterministically; assertions are on counts,
contents and order, never on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from parity import check_outputs_equal

from service.engine import scheduling
from service.engine.batcher import (
    BatcherClosedError,
    BatchPolicy,
    DynamicBatcher,
    NullObserver,
    QueueFullError,
    QueueTimeoutError,
    split_by_length,
)
from service.engine.errors import DeadlineExceededError, InferenceError
from service.metadata import ANONYMOUS

pytestmark = pytest.mark.timeout(30)

Item = tuple[str, int]  # (name, cost)


class FakeModel:
    """run_batch collaborator: records every call and answers f(item); blocks while the gate is shut."""

    def __init__(self, gated: bool = False) -> None:
        self.calls: list[list[Item]] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()

    def __call__(self, items: list[Item]) -> Sequence[Any]:
        self.calls.append(list(items))
        self.started.set()
        assert self.gate.wait(timeout=10), "test never released the gate"
        return [self.answer(item) for item in items]

    @staticmethod
    def answer(item: Item) -> Any:
        return f"out:{item[0]}"

    def seen(self) -> list[str]:
        return [name for call in self.calls for name, _ in call]

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, 10)


class RecordingObserver(NullObserver):
    def __init__(self) -> None:
        self.rejects: list[str] = []
        self.batches: list[tuple[int, int, int]] = []  # (size, padded_tokens, len(queue_seconds))

    def on_reject(self, reason: str) -> None:
        self.rejects.append(reason)

    def on_batch(
        self, size: int, padded_tokens: int, queue_seconds: list[float], compute_seconds: float
    ) -> None:
        assert compute_seconds >= 0 and all(q >= 0 for q in queue_seconds)
        self.batches.append((size, padded_tokens, len(queue_seconds)))


def policy(**overrides: Any) -> BatchPolicy:
    values: dict[str, Any] = dict(
        max_batch_size=8,
        max_batch_tokens=10_000,
        max_queue_delay_ms=5.0,
        max_queue_size=100,
        queue_timeout_s=10.0,
    )
    values.update(overrides)
    return BatchPolicy(**values)


def run(
    model: FakeModel,
    pol: BatchPolicy,
    body: Callable[[DynamicBatcher[Item, Any]], Awaitable[None]],
    observer: NullObserver | None = None,
) -> None:
    """Start a batcher, run the test body, always stop it and open the gate so no thread is left blocked."""

    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", pol, model, observer=observer)
        await batcher.start()
        try:
            await body(batcher)
        finally:
            model.gate.set()
            await batcher.stop(drain=False, timeout_s=5)

    asyncio.run(main())


async def busy(batcher: DynamicBatcher[Item, Any], model: FakeModel) -> asyncio.Task[Any]:
    """Occupy the model with a first request and wait until it is inside run_batch."""
    task = asyncio.create_task(batcher.submit(("first", 1), 1))
    await model.wait_started()
    return task


def queue_items(batcher: DynamicBatcher[Item, Any], items: list[Item]) -> list[asyncio.Task[Any]]:
    return [asyncio.create_task(batcher.submit(item, item[1])) for item in items]


async def settle() -> None:
    """Let freshly created submit tasks run up to their await."""
    for _ in range(3):
        await asyncio.sleep(0)


# --- batch formation ------------------------------------------------------------------


def test_batches_respect_size_and_token_budget_and_results_match() -> None:
    rng = random.Random(0)
    items = [(f"i{n}", rng.randint(1, 20)) for n in range(40)] + [("huge", 100)]
    model = FakeModel(gated=True)
    pol = policy(max_batch_size=4, max_batch_tokens=40, split_ratio=1.0)  # no sub-splitting

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        tasks = queue_items(batcher, items)
        await settle()
        assert batcher.waiting == len(items)
        model.gate.set()
        results = await asyncio.gather(first, *tasks)
        expected = [FakeModel.answer(("first", 1))] + [FakeModel.answer(item) for item in items]
        check_outputs_equal(results, expected, name_a="batched", name_b="each item's own answer")

    run(model, pol, body)
    assert sorted(model.seen()) == sorted(["first"] + [name for name, _ in items])
    for call in model.calls:
        assert len(call) <= 4
        costs = [cost for _, cost in call]
        assert max(costs) * len(costs) <= 40 or len(call) == 1
    assert [("huge", 100)] in model.calls  # bigger than the budget: runs alone
    assert len(model.calls) > 1 + len(items) // 4  # the budget, not only the size, cut batches


def test_concurrent_submits_each_get_their_own_result() -> None:
    model = FakeModel()
    items = [(f"x{n}", 1 + n % 7) for n in range(60)]

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        results = await asyncio.gather(*(batcher.submit(item, item[1]) for item in items))
        expected = [FakeModel.answer(item) for item in items]
        check_outputs_equal(results, expected, name_a="batched", name_b="each item's own answer")

    run(model, policy(max_batch_size=8), body)
    assert all(len(call) <= 8 for call in model.calls)
    assert sorted(model.seen()) == sorted(name for name, _ in items)


def test_split_by_length_rule() -> None:
    costs = [30, 2, 17, 3, 60, 5, 33, 4]
    assert split_by_length(costs, lambda c: c, ratio=2.0, min_tokens=1) == [
        [2, 3, 4],
        [5],
        [17, 30, 33],
        [60],
    ]
    # Short sequences (<= ratio * min_tokens) are never split.
    assert split_by_length(costs, lambda c: c, ratio=2.0, min_tokens=16) == [[2, 3, 4, 5, 17, 30], [33, 60]]
    assert split_by_length(costs, lambda c: c, ratio=1.0) == [sorted(costs)]
    assert split_by_length([], lambda c: c) == []


def test_sub_batches_are_length_sorted() -> None:
    model = FakeModel(gated=True)
    costs = [30, 2, 17, 3, 60, 5, 33, 4]
    items = [(f"c{c}", c) for c in costs]

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        tasks = queue_items(batcher, items)
        await settle()
        model.gate.set()
        await asyncio.gather(first, *tasks)

    run(model, policy(max_batch_size=16, split_ratio=2.0, split_min_tokens=1), body)
    sub_batches = [[cost for _, cost in call] for call in model.calls[1:]]
    assert sub_batches == [[2, 3, 4], [5], [17, 30, 33], [60]]


def test_a_sub_batch_is_answered_while_the_next_one_still_computes() -> None:
    """The sub-batches of one batch run back to back on the compute thread, each answered as it ends:
    the short items' callers do not wait for the long sub-batch after them."""
    long_started, release_long = threading.Event(), threading.Event()

    class SlowLongItems(FakeModel):
        def __call__(self, items: list[Item]) -> Sequence[Any]:
            if any(cost >= 30 for _, cost in items):
                long_started.set()
                assert release_long.wait(timeout=10), "test never released the long sub-batch"
            return super().__call__(items)

    model = SlowLongItems(gated=True)

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        short, long = queue_items(batcher, [("short", 2), ("long", 40)])
        await settle()
        model.gate.set()
        await first
        assert await asyncio.wait_for(short, 10) == FakeModel.answer(("short", 2))
        assert await asyncio.to_thread(long_started.wait, 10)
        assert not long.done()  # still computing: the short one's answer did not wait for it
        release_long.set()
        assert await long == FakeModel.answer(("long", 40))

    try:
        run(model, policy(max_batch_size=16, split_ratio=2.0, split_min_tokens=1), body)
    finally:
        release_long.set()
    assert [[name for name, _ in call] for call in model.calls[1:]] == [["short"], ["long"]]


# --- backpressure, timeouts, cancellation ------------------------------------------------


def test_full_queue_rejects_at_once_with_retry_after() -> None:
    model = FakeModel(gated=True)
    observer = RecordingObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        tasks = queue_items(batcher, [(f"q{n}", 1) for n in range(3)])
        await settle()
        assert batcher.waiting == 3
        with pytest.raises(QueueFullError) as info:
            # The model is still blocked: this can only return because submit does not wait.
            await asyncio.wait_for(batcher.submit(("overflow", 1), 1), timeout=5)
        assert info.value.retry_after_s >= 1
        assert isinstance(info.value.retry_after_s, int)
        assert observer.rejects == ["queue_full"]
        model.gate.set()
        await asyncio.gather(first, *tasks)

    run(model, policy(max_queue_size=3), body, observer)
    assert "overflow" not in model.seen()
    assert observer.rejects == ["queue_full"]


def test_a_permit_holds_a_requests_places_from_before_its_preprocessing() -> None:
    """One admission a request: its places are taken at once (reserve), count against the queue while it
    tokenises, and its items are then queued on them with no check of their own; unused ones go back."""
    model = FakeModel(gated=True)
    observer = RecordingObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        with batcher.reserve(3) as permit:  # a request of three items, before its preprocessing
            with pytest.raises(QueueFullError):  # its places are taken: another request is refused
                batcher.reserve(2)
            with pytest.raises(QueueFullError):
                await batcher.submit(("no permit", 1), 1)
            assert observer.rejects == ["queue_full", "queue_full"]
            tasks = [asyncio.create_task(batcher.submit((f"p{n}", 1), 1, permit)) for n in range(2)]
            await settle()
            assert batcher.waiting == 2 and permit.count == 1  # queued on the permit, no new refusal
            assert observer.rejects == ["queue_full", "queue_full"]
        # the third place was never used: it went back with the permit
        late = asyncio.create_task(batcher.submit(("after", 1), 1))
        await settle()
        assert batcher.waiting == 3 and observer.rejects == ["queue_full", "queue_full"]
        model.gate.set()
        await asyncio.gather(first, late, *tasks)

    run(model, policy(max_queue_size=3), body, observer)
    assert sorted(model.seen()) == ["after", "first", "p0", "p1"]


def test_entry_waiting_past_queue_timeout_fails() -> None:
    model = FakeModel(gated=True)
    observer = RecordingObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        with pytest.raises(QueueTimeoutError):
            await batcher.submit(("late", 1), 1)  # model still blocked: it can only time out
        assert observer.rejects == ["timeout"] and batcher.waiting == 0
        model.gate.set()
        await first
        assert await batcher.submit(("after", 1), 1) == FakeModel.answer(("after", 1))

    run(model, policy(queue_timeout_s=0.05), body, observer)
    assert "late" not in model.seen()
    assert observer.rejects == ["timeout"]


def test_cancelled_submit_never_reaches_the_model() -> None:
    model = FakeModel(gated=True)
    observer = RecordingObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        gone, kept = queue_items(batcher, [("gone", 1), ("kept", 1)])
        await settle()
        assert batcher.waiting == 2
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert observer.rejects == ["cancelled"] and batcher.waiting == 1
        model.gate.set()
        await first
        assert await kept == FakeModel.answer(("kept", 1))

    run(model, policy(), body, observer)
    assert "gone" not in model.seen() and "kept" in model.seen()
    assert observer.rejects == ["cancelled"]


class DepthObserver(RecordingObserver):
    def __init__(self) -> None:
        super().__init__()
        self.depth = 0

    def on_enqueue(self, depth: int) -> None:
        self.depth = depth

    def on_dequeue(self, depth: int) -> None:
        self.depth = depth


def test_a_batch_formed_between_a_cancel_and_its_clean_up_drops_the_items_and_keeps_the_depth_true() -> None:
    """A cancelled caller's futures are cancelled at once, its clean-up runs on the loop's next turn; a busy
    loop can form a batch in between. The items are dropped and counted, and the depth the metrics see is
    the queue's (it stayed at the depth before the cancel: a scaled-in replica still reported 40 waiting)."""
    model = FakeModel(gated=True)
    observer = DepthObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        gone = queue_items(batcher, [("a", 1), ("b", 1)])
        await settle()
        assert batcher.waiting == 2 and observer.depth == 2
        for task in gone:
            task.cancel()  # the entries' futures are cancelled now; the submits' clean-up has not run
        assert batcher._take_batch() == []  # the batcher's loop forming a batch first, as a busy loop may
        assert batcher.waiting == 0 and observer.depth == 0
        for task in gone:
            with pytest.raises(asyncio.CancelledError):
                await task
        assert observer.depth == 0 and observer.rejects == ["cancelled", "cancelled"]
        model.gate.set()
        await first

    run(model, policy(), body, observer)
    assert model.seen() == ["first"]


# --- failures ----------------------------------------------------------------------------


def test_exception_for_one_item_fails_only_that_item() -> None:
    def run_batch(items: list[Item]) -> list[Any]:
        return [ValueError(name) if name.startswith("bad") else f"ok:{name}" for name, _ in items]

    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", policy(max_queue_delay_ms=20), run_batch)
        await batcher.start()
        names = ["a", "bad1", "b", "bad2", "c"]
        results = await asyncio.gather(*(batcher.submit((n, 1), 1) for n in names), return_exceptions=True)
        await batcher.stop()
        assert results[0] == "ok:a" and results[2] == "ok:b" and results[4] == "ok:c"
        assert isinstance(results[1], ValueError) and str(results[1]) == "bad1"
        assert isinstance(results[3], ValueError) and str(results[3]) == "bad2"

    asyncio.run(main())


def test_a_failing_item_fails_alone_and_batcher_keeps_running() -> None:
    """A model call that raises is retried item by item: the bad item fails, its batch-mates complete."""
    model = FakeModel(gated=True)
    calls: list[list[str]] = []

    def run_batch(items: list[Item]) -> Sequence[Any]:
        calls.append([name for name, _ in items])
        if any(name == "boom" for name, _ in items):
            raise RuntimeError("model exploded")
        return model(items)

    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", policy(), run_batch)
        await batcher.start()
        first = await busy(batcher, model)
        tasks = queue_items(batcher, [("boom", 1), ("victim", 1)])
        await settle()
        model.gate.set()
        await first
        boom, victim = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(boom, InferenceError) and isinstance(boom.__cause__, RuntimeError)
        assert "model exploded" in str(boom)
        assert victim == FakeModel.answer(("victim", 1))
        assert await batcher.submit(("next", 1), 1) == FakeModel.answer(("next", 1))
        await batcher.stop()

    asyncio.run(main())
    assert calls == [["first"], ["boom", "victim"], ["boom"], ["victim"], ["next"]]


def test_observer_sees_every_model_call() -> None:
    model = FakeModel()
    observer = RecordingObserver()
    items = [(f"o{n}", 2) for n in range(10)]

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        await asyncio.gather(*(batcher.submit(item, item[1]) for item in items))

    run(model, policy(max_batch_size=4), body, observer)
    assert [size for size, _, _ in observer.batches] == [len(call) for call in model.calls]
    assert all(padded == 2 * size and n == size for size, padded, n in observer.batches)
    assert sum(size for size, _, _ in observer.batches) == len(items)


# --- shutdown ------------------------------------------------------------------------------


def test_stop_with_drain_finishes_queued_work_then_refuses() -> None:
    model = FakeModel(gated=True)

    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", policy(max_batch_size=2), model)
        await batcher.start()
        first = await busy(batcher, model)
        items = [(f"d{n}", 1) for n in range(5)]
        tasks = queue_items(batcher, items)
        await settle()
        stopping = asyncio.create_task(batcher.stop(drain=True, timeout_s=10))
        await settle()
        with pytest.raises(BatcherClosedError):
            await batcher.submit(("refused", 1), 1)
        model.gate.set()
        await stopping
        assert await first == FakeModel.answer(("first", 1))
        drained = await asyncio.gather(*tasks)
        check_outputs_equal(
            drained,
            [FakeModel.answer(item) for item in items],
            name_a="drained",
            name_b="each item's own answer",
        )
        with pytest.raises(BatcherClosedError):
            await batcher.submit(("later", 1), 1)

    asyncio.run(main())
    assert "refused" not in model.seen() and "later" not in model.seen()


def test_stop_without_drain_fails_queued_but_finishes_in_flight() -> None:
    model = FakeModel(gated=True)

    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", policy(), model)
        await batcher.start()
        first = await busy(batcher, model)
        tasks = queue_items(batcher, [("w1", 1), ("w2", 1)])
        await settle()
        stopping = asyncio.create_task(batcher.stop(drain=False, timeout_s=10))
        await settle()
        model.gate.set()
        await stopping
        assert await first == FakeModel.answer(("first", 1))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, BatcherClosedError) for r in results)

    asyncio.run(main())
    assert model.seen() == ["first"]


def test_stop_timeout_fails_the_batch_in_flight() -> None:
    model = FakeModel(gated=True)

    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", policy(), model)
        await batcher.start()
        first = await busy(batcher, model)
        try:
            await batcher.stop(drain=True, timeout_s=0.05)  # the model never finishes in time
            with pytest.raises(BatcherClosedError):
                await first
        finally:
            model.gate.set()  # let the worker thread end

    asyncio.run(main())


def test_submit_before_start_is_refused() -> None:
    async def main() -> None:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher("fake", policy(), FakeModel())
        with pytest.raises(BatcherClosedError):
            await batcher.submit(("early", 1), 1)

    asyncio.run(main())


# --- priority classes and deadlines (engine/scheduling.py) -------------------------------------


async def submit_as(
    batcher: DynamicBatcher[Item, Any], item: Item, priority: int, timeout_s: float | None = None
) -> Any:
    return await batcher.submit(item, item[1], None, ANONYMOUS.scheduled(priority, timeout_s))


def test_the_most_urgent_waiting_item_goes_first_and_fifo_within_a_class() -> None:
    model = FakeModel(gated=True)

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        order = [
            ("low0", scheduling.LOW),
            ("normal0", scheduling.NORMAL),
            ("low1", scheduling.LOW),
            ("high0", scheduling.HIGH),
            ("normal1", scheduling.NORMAL),
            ("high1", scheduling.HIGH),
        ]
        tasks = [asyncio.create_task(submit_as(batcher, (name, 1), p)) for name, p in order]
        await settle()
        model.gate.set()
        await asyncio.gather(first, *tasks)

    run(model, policy(max_batch_size=1), body)
    assert model.seen() == ["first", "high0", "high1", "normal0", "normal1", "low0", "low1"]


def test_a_full_queue_makes_room_for_a_more_urgent_item_by_refusing_the_newest_least_urgent() -> None:
    model = FakeModel(gated=True)
    observer = RecordingObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        lows = [asyncio.create_task(submit_as(batcher, (f"low{n}", 1), scheduling.LOW)) for n in range(2)]
        normal = asyncio.create_task(submit_as(batcher, ("normal", 1), scheduling.NORMAL))
        await settle()
        high = asyncio.create_task(submit_as(batcher, ("high", 1), scheduling.HIGH))
        await settle()
        with pytest.raises(QueueFullError, match="more urgent") as displaced:
            await lows[1]  # the newest of the least urgent class
        assert displaced.value.displaced and displaced.value.retry_after_s >= 1
        with pytest.raises(QueueFullError, match="is full"):  # a low item takes no one's place
            await submit_as(batcher, ("another low", 1), scheduling.LOW)
        model.gate.set()
        await asyncio.gather(first, lows[0], normal, high)

    run(model, policy(max_batch_size=1, max_queue_size=3), body, observer)
    assert model.seen() == ["first", "high", "normal", "low0"]
    assert observer.rejects == ["queue_full", "queue_full"]


def test_a_waiting_item_rises_a_class_as_it_ages_so_low_priority_never_starves() -> None:
    queue: scheduling.PriorityQueue[tuple[str, int, float]] = scheduling.PriorityQueue(
        lambda e: (e[1], e[2]), aging_s=5.0
    )
    queue.append(("old low", scheduling.LOW, 0.0))
    queue.append(("new normal", scheduling.NORMAL, 9.0))
    queue.append(("new high", scheduling.HIGH, 9.5))
    # at 10 s the old low item has waited two agings: it ranks with the high class, and is older
    assert [e[0] for e in queue.in_order(3, now=10.0)] == ["old low", "new high", "new normal"]
    assert [e[0] for e in queue.in_order(3, now=9.9)] == ["new high", "old low", "new normal"]
    assert queue.displaceable(scheduling.HIGH) == ("old low", scheduling.LOW, 0.0)
    assert queue.displaceable(scheduling.LOW) is None


def test_an_item_past_its_own_deadline_is_removed_by_its_timer_and_never_computed() -> None:
    model = FakeModel(gated=True)
    observer = RecordingObserver()

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        with pytest.raises(DeadlineExceededError):  # the model is still blocked: only the timer answers
            await submit_as(batcher, ("late", 1), scheduling.NORMAL, timeout_s=0.05)
        assert batcher.waiting == 0 and observer.rejects == ["deadline"]
        model.gate.set()
        await first

    run(model, policy(queue_timeout_s=10.0), body, observer)
    assert "late" not in model.seen()


def test_a_more_urgent_request_takes_a_place_a_less_urgent_one_reserved_before_queueing() -> None:
    """Places reserved for a low request still tokenising count against the queue; a high request that
    finds the queue full takes one of them, and the low request learns it as it queues (429, displaced)."""
    model = FakeModel(gated=True)

    async def body(batcher: DynamicBatcher[Item, Any]) -> None:
        first = await busy(batcher, model)
        low = batcher.reserve(2, ANONYMOUS.scheduled(scheduling.LOW))  # the whole queue, before its items
        high = batcher.reserve(1, ANONYMOUS.scheduled(scheduling.HIGH))  # full: it takes one of low's places
        with pytest.raises(QueueFullError):
            batcher.reserve(1, ANONYMOUS.scheduled(scheduling.LOW))  # an equally low request takes nothing
        with pytest.raises(QueueFullError, match="more urgent"):
            await batcher.submit(("low item", 1), 1, low)
        low.release()
        urgent = asyncio.create_task(batcher.submit(("high item", 1), 1, high))
        await settle()
        model.gate.set()
        await asyncio.gather(first, urgent)

    run(model, policy(max_queue_size=2), body)
    assert model.seen() == ["first", "high item"]


# --- instances (MODEL_INSTANCES) --------------------------------------------------------


class InstanceRecorder:
    """run_batch for a batcher with instances: records which instance ran each call, and how many calls
    were inside it at once; each call waits (up to 10 s) until ``together`` calls are inside."""

    def __init__(self, together: int) -> None:
        self.barrier = threading.Barrier(together)
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.instances: list[int] = []

    def __call__(self, items: list[Item]) -> Sequence[Any]:
        from service.engine import instances

        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.instances.append(instances.current())
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait(timeout=10)
        with self.lock:
            self.inside -= 1
        return [FakeModel.answer(item) for item in items]


def test_with_two_instances_two_batches_run_at_once_each_on_its_own_instance() -> None:
    recorder = InstanceRecorder(together=2)

    async def main() -> list[Any]:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher(
            "fake", policy(max_batch_size=1, max_queue_delay_ms=0), recorder, instances=2
        )
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit((f"i{n}", 1), 1) for n in range(6)))
        finally:
            await batcher.stop(drain=True, timeout_s=5)

    answers = asyncio.run(main())
    assert answers == [f"out:i{n}" for n in range(6)]
    assert recorder.most_inside == 2  # the barrier let no call through alone: pairs ran together
    assert sorted(set(recorder.instances)) == [0, 1]
    assert not recorder.barrier.broken


def test_with_one_instance_batches_never_overlap() -> None:
    recorder = InstanceRecorder(together=1)

    async def main() -> list[Any]:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher(
            "fake", policy(max_batch_size=1, max_queue_delay_ms=0), recorder
        )
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit((f"i{n}", 1), 1) for n in range(6)))
        finally:
            await batcher.stop(drain=True, timeout_s=5)

    assert asyncio.run(main()) == [f"out:i{n}" for n in range(6)]
    assert recorder.most_inside == 1 and set(recorder.instances) == {0}


def test_stop_past_its_deadline_fails_every_batch_in_flight_on_every_instance() -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def stuck(items: list[Item]) -> Sequence[Any]:
        entered.release()
        gate.wait(timeout=10)
        return [FakeModel.answer(item) for item in items]

    async def main() -> list[Any]:
        batcher: DynamicBatcher[Item, Any] = DynamicBatcher(
            "fake", policy(max_batch_size=1, max_queue_delay_ms=0), stuck, instances=2
        )
        await batcher.start()
        tasks = [asyncio.create_task(batcher.submit((f"i{n}", 1), 1)) for n in range(2)]
        for _ in range(2):
            assert await asyncio.to_thread(entered.acquire, True, 10)
        try:
            await batcher.stop(drain=True, timeout_s=0.2)
            return await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            gate.set()

    results = asyncio.run(main())
    assert len(results) == 2 and all(isinstance(r, BatcherClosedError) for r in results), results
