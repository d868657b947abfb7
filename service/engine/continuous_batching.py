"""Continuous batching for a decoder-only LM with the KV cache: one decoding loop per model.

TGI / vLLM style, at the step level. A new request is prefilled (its prompt run
with an empty past; requests that arrive together are prefilled together,
left-padded) and joins the running batch at the next decoding step; a sequence
that finishes (eos, stop string, length, cancelled) leaves the batch at once
and its cache rows are dropped. Nobody waits for anybody else.

The merged cache is LEFT-padded: row i's real tokens fill the last
``lengths[i]`` columns of every past tensor, so each step appends one column on
the right for every row. The attention mask covers past + new columns and the
position ids skip the padding (``cumsum(mask) - 1``); the graph gives masked
columns exactly zero attention weight, so a sequence decodes the same tokens
alone or in any batch (up to float rounding). Joining pads caches on the left
to a common width; leaving trims the left columns that are padding in every
remaining row, so the width is always the longest live sequence.

Every ONNX Runtime call, cache copy and sampling step runs in a single-thread
executor owned by the engine, so the event loop stays free to accept requests
and stream events. On CUDA the cache stays on the device: with the fp16 in-place step graph,
in buffers that rows join and leave on the device (``device_kv.py``);
without it, as the Concat graph's outputs between steps (IO binding), joins
and leaves going through host memory. Metrics go through the observer only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from opentelemetry.context import Context

from service.metadata import ANONYMOUS, RequestMeta
from service.observe import spans

from . import scheduling
from .decoder_graph import DecoderGraph
from .errors import (
    DeadlineExceededError,
    EngineError,
    InferenceError,
    PromptError,
    QueueFullError,
    QueueTimeoutError,
)
from .generation_contract import (
    GenerationObserver,
    GenerationRequest,
    NullGenerationObserver,
    TokenEvent,
)
from .generation_stream import GenerationStream
from .generation_trace import SequenceTrace
from .kv_cache import KVCache
from .manifest import required
from .prefix_cache import PrefixCache
from .repository import LoadedModel
from .running_batch import RunningBatch, SequenceState
from .speculation import Speculation
from .structured_output import Grammar, GrammarCompiler
from .worker import ModelWorker, Permit, with_defaults

log = logging.getLogger(__name__)


class GenerationEngine(ModelWorker):
    """Queue, admission and the decoding loop of one generative model (see the module docstring)."""

    kind = "generation"

    def __init__(
        self,
        model: LoadedModel,
        *,
        max_running: int,
        max_queue_size: int,
        queue_timeout_s: float,
        observer: GenerationObserver | None = None,
        prefix_cache_bytes: int = 0,
        prefix_block_tokens: int = 16,
        speculation: Speculation | None = None,
    ) -> None:
        assert model.task == "text-generation", f"{model.name} is a {model.task} model, not text-generation"
        assert model.tokenizer is not None, f"{model.name} has no tokenizer"
        assert queue_timeout_s > 0, "queue_timeout_s must be positive"
        self._hooks = with_defaults(observer, NullGenerationObserver)
        super().__init__(model.name, max_queue_size, max_running, self._hooks.on_reject)
        self.tokenizer = model.tokenizer
        manifest = model.manifest
        self.max_context = required(manifest.max_sequence_length)
        self.eos_id = manifest.token("eos")
        self.vocab_size = int(manifest.config.get("vocab_size") or model.tokenizer.get_vocab_size())
        self.max_running = max_running
        self.queue_timeout_s = queue_timeout_s
        self.grammars = GrammarCompiler(model.tokenizer, self.vocab_size, self.eos_id)
        prefixes = PrefixCache(prefix_block_tokens, prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._batch = RunningBatch(
            DecoderGraph(model.graphs["model"], manifest, model.inplace.get("model"), max_rows=max_running),
            self.grammars,
            prefixes,
            speculation,
        )
        self._speculated = (0, 0)  # tokens proposed and accepted, already reported
        self._waiting: scheduling.PriorityQueue[SequenceState] = scheduling.PriorityQueue(
            lambda s: (s.priority, s.submitted_at), ceiling=lambda s: s.most_urgent
        )
        self._prefilling: list[SequenceState] = []
        self._preparing: list[SequenceState] = []  # structured: its grammar compiling; it waits once done
        self._shares: weakref.WeakValueDictionary[str, scheduling.Share] = weakref.WeakValueDictionary()
        self._prefix_counted = (0, 0)  # prompt tokens queried and found, already reported
        self.cancelled_sequences = 0
        self._span_attributes = model.span_attributes

    # --- gauges -------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Sequences admitted (being prefilled or in the batch) and not finished."""
        return sum(not s.done for s in (*self._prefilling, *self._batch.rows))

    # --- public API (start, admit, retry_after_s, stop: ModelWorker) -----------------------

    def submit(
        self, request: GenerationRequest, permit: Permit | None = None, meta: RequestMeta = ANONYMOUS
    ) -> GenerationStream:
        """Queue one request and return its stream at once (``submit_all`` of one)."""
        (stream,) = self.submit_all([request], permit, meta)
        return stream

    def submit_all(
        self,
        requests: Sequence[GenerationRequest],
        permit: Permit | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> list[GenerationStream]:
        """Queue every request or none, and return their streams at once; never waits for room.

        Each prompt is checked here, once, before any is queued (``check_prompt``). Raises
        BatcherClosedError when not running, PromptError naming the first prompt that cannot fit (its
        ``index``), and QueueFullError when the queue has no room for all (unless ``permit`` holds
        their places, taken before their prompts were tokenised). ``meta``: the request's priority and
        deadline (its ``scheduling``), and the span the sequences' spans are children of (its ``trace``).
        """
        asked, trace = meta.scheduling, meta.trace
        self.check_open()
        for index, request in enumerate(requests):
            try:
                self.check_prompt(request.prompt_ids)
            except PromptError as exc:
                exc.index = index
                raise
        if permit is None:
            self.admit(len(requests), asked.priority)
        else:
            permit.check()  # before any is queued: a request's sequences are queued all or none
        share = self._share_of(requests[0].request_id if requests else "")
        return [self._queue(request, permit, asked, trace, share) for request in requests]

    def _share_of(self, request_id: str) -> scheduling.Share:
        """The share of the request ``request_id`` (one request's choices are queued by several calls):
        held by its sequences, so forgotten with the last of them; a request without an id has its own."""
        if not request_id:
            return scheduling.Share()
        share = self._shares.get(request_id)
        if share is None:
            share = self._shares[request_id] = scheduling.Share()
        return share

    async def admit_all(
        self,
        requests: Sequence[GenerationRequest],
        permit: Permit | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> list[GenerationStream]:
        """``submit_all`` as a coroutine: what a pipeline awaits, here or across a process boundary (the
        split service's front end waits for the engine process to take the requests, so that a refusal is
        still an ordinary error before any token, as here)."""
        return self.submit_all(requests, permit, meta)

    def _queue(
        self,
        request: GenerationRequest,
        permit: Permit | None,
        asked: scheduling.Scheduling,
        trace: Context | None,
        share: scheduling.Share,
    ) -> GenerationStream:
        if permit is not None:
            permit.use()
        stream = GenerationStream(request, self.name, self._on_stream_cancel)
        seq = SequenceState(
            request,
            stream,
            max_context=self.max_context,
            eos_id=self.eos_id,
            vocab_size=self.vocab_size,
            decode=self.tokenizer.decode,
        )
        if trace is not None:
            seq.trace = SequenceTrace(trace, request, seq.submitted_at)
            stream.on_end = partial(self._traced_end, seq)
        seq.priority, seq.deadline, seq.most_urgent = asked.priority, asked.deadline, asked.most_urgent
        seq.share = share
        seq.expires_at, seq.client_deadline = asked.wait_limit(self.queue_timeout_s, seq.submitted_at)
        loop = asyncio.get_running_loop()
        seq.timer = loop.call_at(loop.time() + max(0.0, seq.expires_at - seq.submitted_at), self._expire, seq)
        structured = request.sampling.structured_outputs
        if structured is None:
            self._wait(seq)
        else:  # compiled, and its first mask computed, on a compile thread: never in the decoding loop
            self._preparing.append(seq)
            prepared = self.grammars.prepare(structured)
            prepared.add_done_callback(lambda done: loop.call_soon_threadsafe(self._prepared, seq, done))
        return stream

    def _wait(self, seq: SequenceState) -> None:
        self._waiting.append(seq)
        self._depth_changed()
        self._wakeup.set()

    def _prepared(self, seq: SequenceState, done: Future[Grammar]) -> None:
        """A structured sequence's grammar is ready: it waits for a place in the batch like any other."""
        if seq not in self._preparing:  # expired or failed meanwhile
            return
        self._preparing.remove(seq)
        error = done.exception()
        if error is not None:
            if seq.timer is not None:
                seq.timer.cancel()
            seq.stream._fail(InferenceError(self.name, error))
            self._depth_changed()
            self._wakeup.set()
            return
        seq.grammar = done.result()
        self._wait(seq)

    # --- admission ----------------------------------------------------------------------------

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Raise PromptError unless the prompt fits: some tokens, known ids, room for one new token."""
        if not prompt_ids:
            raise PromptError("prompt encodes to no tokens", "empty")
        if len(prompt_ids) >= self.max_context:
            raise PromptError(
                f"prompt is {len(prompt_ids)} tokens; model {self.name!r} holds {self.max_context} "
                "tokens of context, including at least one new token",
                "too_long",
            )
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise PromptError(f"prompt token ids must lie in [0, {self.vocab_size})", "unknown_token")

    def _admit(self) -> list[SequenceState]:
        """Take waiting sequences, the most urgent class first, while the batch has room; within a class,
        round robin by request: a sequence of the request with the fewest running, then the fewest
        admitted so far (the oldest first among equals), so one request's many sequences (``n``,
        ``best_of``, many prompts) share the batch with the requests behind them rather than fill it."""
        newcomers: list[SequenceState] = []
        now = time.monotonic()
        running = Counter(s.share for s in (*self._prefilling, *self._batch.rows) if not s.done)
        popped = False
        while self._waiting and self.running + len(newcomers) < self.max_running:
            seq = self._waiting.popleft(now, share=lambda s: (running[s.share], s.share.taken))
            popped = True
            if seq.timer is not None:
                seq.timer.cancel()
            if not seq.done:
                newcomers.append(seq)
                running[seq.share] += 1
                seq.share.taken += 1
                self._hooks.on_class_wait(seq.priority, now - seq.submitted_at)
                if seq.trace is not None:
                    seq.trace.admitted_at = now
        if popped:  # a sequence ended while it waited leaves the queue here too: the depth must say so
            self._depth_changed()
        return newcomers

    def _expire(self, seq: SequenceState) -> None:
        """Timer callback at its deadline: the request waited too long for a place in the batch."""
        if seq in self._preparing:
            self._preparing.remove(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)
        else:
            return
        waited = time.monotonic() - seq.submitted_at
        self._hooks.on_reject("deadline" if seq.client_deadline else "timeout")
        self._hooks.on_class_expired(seq.priority)
        error = DeadlineExceededError if seq.client_deadline else QueueTimeoutError
        seq.stream._fail(error(self.name, waited))
        self._depth_changed()

    def _displace(self, priority: int) -> bool:
        victim = self._waiting.displaceable(priority)
        if victim is None:
            return False
        self._waiting.remove(victim)
        if victim.timer is not None:
            victim.timer.cancel()
        self._hooks.on_reject("queue_full")
        self._hooks.on_class_displaced(victim.priority)
        victim.stream._fail(
            QueueFullError(self.name, len(self._waiting), self.retry_after_s(), displaced=True)
        )
        self._depth_changed()
        return True

    def _on_stream_cancel(self, stream: GenerationStream) -> None:
        """Stream callback on ``cancel()``: count it; a waiting sequence leaves the queue now."""
        self.cancelled_sequences += 1
        self._hooks.on_cancel()
        for seq in self._waiting:
            if seq.stream is stream:
                self._waiting.remove(seq)
                if seq.timer is not None:
                    seq.timer.cancel()
                break
        self._depth_changed()
        self._wakeup.set()

    def _depth_changed(self) -> None:
        self._hooks.on_depth(len(self._waiting), self.running)
        self._hooks.on_class_depth(self._waiting.depth_by_class())

    # --- decoding loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        while await self._has_work():
            try:
                newcomers = self._admit()
                joining = await self._prefill(newcomers) if newcomers else []
                await self._decode(joining)
            except Exception as exc:  # a bug or a failed model call must not stop the model from serving
                log.exception("generation %s: decoding step failed", self.name)
                self._fail_running(EngineError(f"generation failed: {exc!r}"))

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._preparing)

    def waiting_by_class(self) -> dict[int, int]:
        return self._waiting.depth_by_class()

    async def _has_work(self) -> bool:
        """Wait until something waits or runs; False once closed with nothing left."""
        while not (self._waiting or self._batch.rows):
            if self._closed and not self._preparing:
                return False
            self._wakeup.clear()
            await self._wakeup.wait()
        return True

    async def _compute(self, fn: Callable[[], Any], batch_size: int) -> Any:
        started = time.monotonic()
        result = await self.in_compute_thread(fn)
        self._hooks.on_step(batch_size, time.monotonic() - started)
        return result

    async def _prefill(self, newcomers: list[SequenceState]) -> list[tuple[list[SequenceState], KVCache]]:
        """Prefill the newcomers together; if that fails, each alone, so only a failing prompt fails.

        The running batch goes on either way.
        """
        self._prefilling = newcomers
        try:
            groups = self._batch.prefill_groups(newcomers)
            joining: list[tuple[list[SequenceState], KVCache]] = []
            while groups:
                group = groups.pop(0)
                started = time.monotonic()
                try:
                    events, cache = await self._compute(partial(self._batch.prefill, group), len(group))
                except Exception as exc:
                    log.error(
                        "generation %s: prefill of %d sequence(s) failed", self.name, len(group), exc_info=exc
                    )
                    if len(group) > 1:
                        groups += [[seq] for seq in group]
                        continue
                    group[0].stream._fail(InferenceError(self.name, exc))
                    continue
                if spans.on():
                    with spans.guard("prefill"):
                        self._trace_prefill(group, started, cache.width)
                self._prefix_cache_changed()
                self._publish(list(zip(group, events, strict=True)))
                joining.append((group, cache))
            return joining
        finally:
            self._prefilling = []

    def _prefix_cache_changed(self) -> None:
        prefixes = self._batch.prefix_cache
        if prefixes is not None:
            stats = prefixes.stats()
            queried, hit = (
                stats.queried_tokens - self._prefix_counted[0],
                stats.hit_tokens - self._prefix_counted[1],
            )
            self._prefix_counted = (stats.queried_tokens, stats.hit_tokens)
            self._hooks.on_prefix_cache(queried, hit, stats.blocks, stats.bytes)

    def _trace_prefill(self, group: list[SequenceState], started: float, padded_length: int) -> None:
        """The prefill's model run as a ``batch`` span linked to each traced sequence's request, and each
        sequence's prefill window (recorded with its other spans when its stream ends)."""
        traced = [seq.trace for seq in group if seq.trace is not None]
        if not traced:
            return
        ended = time.monotonic()
        batch = spans.record_batch(
            self._span_attributes,
            started,
            ended,
            len(group),
            padded_length,
            [trace.context for trace in traced],
            phase="prefill",
        )
        for trace in traced:
            trace.prefill_started, trace.prefill_ended = started, ended
            if batch is not None:
                trace.prefill_batch = [spans.link_to(batch)]

    def _traced_end(self, seq: SequenceState, stream: GenerationStream) -> None:
        """A traced sequence's stream ended (finished, failed, or cancelled by its client): its spans."""
        assert seq.trace is not None
        result, error = stream._result, stream._error
        reason = result.finish_reason if result is not None else "error" if error is not None else "cancelled"
        tokens = result.completion_tokens if result is not None else len(seq.generated)
        with spans.guard("sequence"):
            seq.trace.record(
                self._span_attributes,
                output_tokens=tokens,
                finish_reason=reason,
                first_token_at=seq.first_token_at,
                error=error,
            )

    async def _decode(self, joining: list[tuple[list[SequenceState], KVCache]]) -> None:
        joined = [s for seqs, _ in joining for s in seqs]
        live = sum(not s.done for s in (*self._batch.rows, *joined))
        if not live:  # nothing to compute: just let the finished and cancelled rows go
            self._batch.leave()
            return
        self._publish(await self._compute(lambda: self._batch.step(joining), live))
        batch = self._batch
        if batch.proposed_tokens != self._speculated[0]:
            proposed, accepted = (
                batch.proposed_tokens - self._speculated[0],
                batch.accepted_tokens - self._speculated[1],
            )
            self._speculated = (batch.proposed_tokens, batch.accepted_tokens)
            self._hooks.on_speculation(proposed, accepted)

    def _publish(self, events: list[tuple[SequenceState, TokenEvent]]) -> None:
        """Hand each event to its stream (unless cancelled meanwhile) and close finished sequences."""
        now = time.monotonic()
        for seq, event in events:
            if seq.stream.done:
                continue
            if event.index == 0:
                seq.first_token_at = now
                self._hooks.on_first_token(now - seq.submitted_at)
            else:
                self._hooks.on_token(now - seq.last_token_at)
            seq.last_token_at = now
            seq.stream._push(event)
            if seq.finish_reason is None and seq.deadline is not None and now >= seq.deadline:
                seq.end_at_deadline()  # it leaves the batch at the next step
            if seq.finish_reason is not None and event.index == len(seq.generated) - 1:  # its last event
                self._finish(seq, now)

    def _finish(self, seq: SequenceState, now: float) -> None:
        result = seq.result(now)
        seq.stream._finish(result)
        self._hooks.on_finish(result.finish_reason, result.completion_tokens)
        self._record(result.seconds)
        self._depth_changed()

    def _fail_running(self, error: BaseException) -> None:
        for seq in (*self._prefilling, *self._batch.reset()):
            seq.stream._fail(error)
        self._prefilling = []
        self._depth_changed()

    def _fail_pending(self, error: BaseException, drained: bool) -> None:
        preparing, self._preparing = self._preparing, []
        for seq in preparing:
            if seq.timer is not None:
                seq.timer.cancel()
            seq.stream._fail(error)
        while self._waiting:
            seq = self._waiting.popleft()
            if seq.timer is not None:
                seq.timer.cancel()
            if not seq.done:
                self._hooks.on_reject("closed")
                seq.stream._fail(error)
        for seq in (*self._prefilling, *self._batch.rows):
            seq.stream._fail(error)  # they leave the batch at the next step
        self._depth_changed()
