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
and stream events. On CUDA the cache stays on the device between steps (IO
binding) while the batch composition is unchanged; joins and leaves go
through host memory. Metrics go through the observer only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from .errors import BatcherClosedError, EngineError, InferenceError, QueueFullError, QueueTimeoutError
from .repository import LoadedModel
from .runtime import Graph, ort
from .sampling import SamplingParams, TokenSampler

__all__ = [
    "CacheLayout",
    "DecoderGraph",
    "GenerationCancelledError",
    "GenerationEngine",
    "GenerationObserver",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStream",
    "IncrementalDetokenizer",
    "KVCache",
    "NullGenerationObserver",
    "TokenEvent",
]

log = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"  # what a byte-level BPE decode shows for a character cut mid-way
_EWMA_ALPHA = 0.2  # weight of the newest sequence duration in the Retry-After estimate


# --- the public contract (docs/GENERATION_ENGINE_API.md) --------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]  # already tokenized, non-empty
    max_new_tokens: int
    sampling: SamplingParams  # greedy when temperature == 0; seed for reproducible sampling
    stop: tuple[str, ...] = ()  # the text is cut before the first stop string found (finish "stop")
    request_id: str = ""


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; ``text`` may be "" while a character or a possible stop string is incomplete."""

    index: int  # 0-based position in the completion
    token_id: int
    text: str  # what this token adds; all event texts joined == the result text


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]  # every generated id, eos included when it ended the sequence
    text: str
    finish_reason: str  # "length" | "stop" | "eos"
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float
    seconds: float


class GenerationCancelledError(EngineError):
    """``result()`` of a stream whose client went away (``cancel()`` or an abandoned iteration)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"generation on model {model!r} was cancelled")
        self.model = model


class GenerationObserver(Protocol):
    """Where metrics hook in; called on the event loop. Every hook is optional (see ``_Hooks``).

    Reject reasons: ``"queue_full"``, ``"timeout"``, ``"closed"``.
    """

    def on_first_token(self, seconds: float) -> None: ...

    def on_token(self, inter_token_seconds: float) -> None: ...

    def on_step(self, batch_size: int, seconds: float) -> None: ...

    def on_finish(self, reason: str, completion_tokens: int) -> None: ...

    def on_cancel(self) -> None: ...

    def on_reject(self, reason: str) -> None: ...

    def on_depth(self, waiting: int, running: int) -> None: ...


class NullGenerationObserver:
    """No-op observer; subclass it and override only the hooks you need."""

    def on_first_token(self, seconds: float) -> None:
        pass

    def on_token(self, inter_token_seconds: float) -> None:
        pass

    def on_step(self, batch_size: int, seconds: float) -> None:
        pass

    def on_finish(self, reason: str, completion_tokens: int) -> None:
        pass

    def on_cancel(self) -> None:
        pass

    def on_reject(self, reason: str) -> None:
        pass

    def on_depth(self, waiting: int, running: int) -> None:
        pass


class _Hooks(NullGenerationObserver):
    """The given observer's hooks, with a no-op for any it lacks (the contract makes them all optional)."""

    def __init__(self, observer: object | None) -> None:
        for name in NullGenerationObserver.__dict__:
            if name.startswith("on_") and observer is not None and hasattr(observer, name):
                setattr(self, name, getattr(observer, name))


# --- the KV cache -----------------------------------------------------------------------


@dataclass(frozen=True)
class CacheLayout:
    """The graph's KV-cache names and shapes, from the manifest's ``kv_cache`` entry."""

    past_names: list[str]  # past_key.0, past_value.0, past_key.1, ...
    present_names: list[str]  # in the same order
    num_heads: int
    head_dim: int
    dtype: np.dtype[Any]

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> CacheLayout:
        kv = manifest["kv_cache"]
        layers = range(int(kv["num_layers"]))
        return cls(
            past_names=[kv[f"past_{k}"].format(i=i) for i in layers for k in ("key", "value")],
            present_names=[kv[f"present_{k}"].format(i=i) for i in layers for k in ("key", "value")],
            num_heads=int(kv["num_heads"]),
            head_dim=int(kv["head_dim"]),
            dtype=np.dtype(kv.get("dtype", "float32")),
        )

    def empty(self, rows: int) -> list[np.ndarray]:
        """A zero-length past for a prefill: (rows, H, 0, Dh) per name."""
        return [np.zeros((rows, self.num_heads, 0, self.head_dim), self.dtype) for _ in self.past_names]


def to_host(tensor: Any) -> np.ndarray:
    """A cache tensor as numpy: device OrtValues (CUDA path) are copied to host, arrays pass through."""
    return tensor.numpy() if isinstance(tensor, ort.OrtValue) else tensor


class KVCache:
    """The past keys/values of a batch, right-aligned: row i's real tokens fill its last ``lengths[i]`` columns.

    ``tensors`` are (B, H, W, Dh) per past name, numpy arrays or, on CUDA, device
    OrtValues straight from the previous step. The columns left of a row's real
    tokens are padding: masked, so their content never matters.
    """

    def __init__(self, tensors: list[Any], lengths: np.ndarray, width: int) -> None:
        self.tensors = tensors
        self.lengths = lengths  # (B,) int64: real tokens per row
        self.width = width  # W
        assert int(lengths.max(initial=0)) <= width, f"a row holds more than the cache width {width}"

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def attention_mask(self, new: int) -> np.ndarray:
        """(B, W + new): 0 over each row's left padding, 1 over its past and the ``new`` columns."""
        columns = np.arange(self.width + new)  # (W + new,)
        return (columns[None, :] >= (self.width - self.lengths)[:, None]).astype(np.int64)

    def select(self, rows: Sequence[int]) -> KVCache:
        """Keep ``rows`` (in that order) and trim the left columns that are padding in all of them."""
        index = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[index]
        width = int(lengths.max(initial=0))
        start = self.width - width
        tensors = [np.ascontiguousarray(to_host(t)[index, :, start:, :]) for t in self.tensors]
        return KVCache(tensors, lengths, width)

    def padded(self, width: int) -> list[np.ndarray]:
        """The tensors on the host, padded on the left with zeros to ``width`` columns."""
        host = [to_host(t) for t in self.tensors]
        if width == self.width:
            return host
        pad = ((0, 0), (0, 0), (width - self.width, 0), (0, 0))
        return [np.pad(t, pad) for t in host]

    @staticmethod
    def merge(first: KVCache, second: KVCache) -> KVCache:
        """Rows of ``first`` then ``second``, both padded on the left to the wider of the two."""
        width = max(first.width, second.width)
        tensors = [
            np.concatenate([a, b], axis=0)  # (B1 + B2, H, W, Dh)
            for a, b in zip(first.padded(width), second.padded(width), strict=True)
        ]
        return KVCache(tensors, np.concatenate([first.lengths, second.lengths]), width)


def positions_from_mask(mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids (B, new) of the last ``new`` columns: real tokens count from 0, padding is skipped."""
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, -new:].astype(np.int64)


# --- running the graph ------------------------------------------------------------------

# (input_ids (B, T), attention_mask (B, P + T), position_ids (B, T), past) -> (last logits (B, V), present)
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray, list[Any]], tuple[np.ndarray, list[Any]]]


def host_step(graph: Graph, layout: CacheLayout) -> StepFn:
    """CPU path: numpy in, numpy out."""
    outputs = [graph.output_names[0], *layout.present_names]  # logits first

    def step(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[Any]) -> tuple[Any, Any]:
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        feeds.update(zip(layout.past_names, map(to_host, past), strict=True))
        logits, *present = graph.session.run(outputs, feeds)
        return logits[:, -1, :], present  # (B, V), (B, H, P + T, Dh) each

    return step


def cuda_step(graph: Graph, layout: CacheLayout) -> StepFn:
    """CUDA path: IO binding, the present keys/values stay on the device and come back as the next past.

    A past that is a device OrtValue (the previous step's present, batch unchanged)
    is bound as is; a numpy past (after a join or a leave) is uploaded once. Only the
    last position's logits need the host.
    """
    options = graph.session.get_provider_options().get("CUDAExecutionProvider", {})
    device_id = int(options.get("device_id", 0))

    def on_device(value: Any) -> Any:
        if isinstance(value, ort.OrtValue):
            return value
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", device_id)

    def step(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[Any]) -> tuple[Any, Any]:
        binding = graph.session.io_binding()
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        inputs.update(zip(layout.past_names, past, strict=True))
        bound = {name: on_device(value) for name, value in inputs.items()}  # kept alive for the run
        for name, value in bound.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(graph.output_names[0], "cpu")  # logits: the sampler needs them on the host
        for name in layout.present_names:
            binding.bind_output(name, "cuda", device_id)
        graph.session.run_with_iobinding(binding)
        logits, *present = binding.get_outputs()  # in the order bound
        return logits.numpy()[:, -1, :], present

    return step


class DecoderGraph:
    """The KV-cached GPT graph: a batched prefill with an empty past, and one decoding step."""

    def __init__(self, graph: Graph, manifest: dict[str, Any]) -> None:
        self.layout = CacheLayout.from_manifest(manifest)
        special = manifest["special_tokens"]
        self.pad_id = int(special.get("pad", special["eos"]))
        self._step = cuda_step(graph, self.layout) if graph.on_cuda else host_step(graph, self.layout)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, KVCache]:
        """Left-padded prompts with an empty past -> logits of each prompt's last token (n, V) and its cache."""
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)  # (n,)
        width = int(lengths.max())
        ids = np.full((len(prompts), width), self.pad_id, dtype=np.int64)  # (n, L)
        mask = np.zeros((len(prompts), width), dtype=np.int64)  # (n, L)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
            mask[row, width - len(prompt) :] = 1
        logits, present = self._step(
            ids, mask, positions_from_mask(mask, width), self.layout.empty(len(prompts))
        )
        return logits, KVCache(present, lengths, width)

    def decode(self, tokens: np.ndarray, cache: KVCache) -> tuple[np.ndarray, KVCache]:
        """One new token per row (B,) -> logits (B, V) and the cache one column wider."""
        mask = cache.attention_mask(new=1)  # (B, W + 1)
        logits, present = self._step(
            tokens.reshape(-1, 1).astype(np.int64), mask, positions_from_mask(mask, 1), cache.tensors
        )
        return logits, KVCache(present, cache.lengths + 1, cache.width + 1)


# --- text ------------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Streaming text of one sequence: each step decodes all generated ids and hands out the new suffix.

    Held back until the next token settles it: a trailing U+FFFD (byte-level BPE
    cut a character mid-way) and a trailing piece that could be the start of a stop
    string (once handed out, text cannot be taken back). So the pieces handed out
    always join to the final text, which stops before the first stop string.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._longest = max(map(len, self._stop), default=0)
        self._searched = 0  # length of the settled text already searched for stop strings
        self.text = ""  # handed out so far
        self.stopped = False

    def step(self, ids: list[int]) -> str:
        """The text that the newest of ``ids`` adds (may be ""); sets ``stopped`` on a stop string."""
        settled = self._decode(ids).rstrip(REPLACEMENT_CHAR)
        cut = self._find_stop(settled)
        if cut is not None:
            self.stopped = True
            return self._hand_out(settled[:cut])
        return self._hand_out(settled[: len(settled) - self._stop_prefix(settled)])

    def flush(self, ids: list[int]) -> str:
        """The sequence ended without a stop string: hand out everything held back."""
        return self._hand_out(self._decode(ids))

    def _hand_out(self, upto: str) -> str:
        piece = upto[len(self.text) :]
        self.text += piece
        return piece

    def _find_stop(self, settled: str) -> int | None:
        """Start of the earliest stop string in ``settled``; only text new since the last step can hold a new one."""
        start = max(0, self._searched - self._longest + 1)
        self._searched = len(settled)
        found = [i for i in (settled.find(s, start) for s in self._stop) if i >= 0]
        return min(found) if found else None

    def _stop_prefix(self, settled: str) -> int:
        """Length of the longest suffix of ``settled`` that is a proper prefix of some stop string."""
        for k in range(min(self._longest - 1, len(settled)), 0, -1):
            if any(s.startswith(settled[-k:]) for s in self._stop if len(s) > k):
                return k
        return 0


# --- one request -----------------------------------------------------------------------


class GenerationStream:
    """The caller's handle on one sequence: its token events, its result, and ``cancel()``.

    Events are kept, so a caller may iterate, await ``result()``, or both. Leaving
    the iteration early (``aclose``, ``break`` then garbage collection, or the
    iterating task being cancelled) cancels the sequence, as a client disconnect should.
    """

    def __init__(self, request: GenerationRequest, model: str, on_cancel: Callable[[GenerationStream], None]):
        self.request = request
        self._model = model
        self._on_cancel = on_cancel
        self._events: list[TokenEvent] = []
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._changed = asyncio.Event()

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled: no further events."""
        return self._result is not None or self._error is not None or self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        """One event per generated token, in order; raises the sequence's error, ends at once when cancelled."""
        seen = 0
        try:
            while True:
                while seen < len(self._events) and not self._cancelled:
                    seen += 1
                    yield self._events[seen - 1]
                if self._error is not None:
                    raise self._error
                if self.done:
                    return
                await self._wait()
        finally:
            if not self.done:  # the consumer left before the end: the client went away
                self.cancel()

    async def result(self) -> GenerationResult:
        """The finished sequence; raises its error, or GenerationCancelledError after ``cancel()``."""
        while not self.done:
            await self._wait()
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise GenerationCancelledError(self._model)
        return self._result

    def cancel(self) -> None:
        """The client went away: no more events, and the sequence leaves the batch at the next step."""
        if self.done:
            return
        self._cancelled = True
        self._notify()
        self._on_cancel(self)

    # engine side (event loop only)

    def _push(self, event: TokenEvent) -> None:
        if not self.done:
            self._events.append(event)
            self._notify()

    def _finish(self, result: GenerationResult) -> None:
        if not self.done:
            self._result = result
            self._notify()

    def _fail(self, error: BaseException) -> None:
        if not self.done:
            self._error = error
            self._notify()

    def _notify(self) -> None:
        """Wake every waiter; the next waiters wait on a fresh event."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()


class _Sequence:
    """Engine-side state of one request: sampler, generated ids, text, finish. Advanced in the executor."""

    def __init__(self, request: GenerationRequest, stream: GenerationStream, engine: GenerationEngine):
        self.request = request
        self.stream = stream
        self.sampler = TokenSampler(request.sampling)
        self.ids = list(request.prompt_ids)  # prompt + generated: what the repetition penalty looks at
        self.generated: list[int] = []
        # Prompt + generated tokens never exceed the position table.
        self.limit = min(request.max_new_tokens, engine.max_context - len(request.prompt_ids))
        self.eos_id = engine.eos_id
        self.detokenizer = IncrementalDetokenizer(engine.tokenizer.decode, request.stop)
        self.finish_reason: str | None = None
        self.submitted_at = time.monotonic()
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.timer: asyncio.TimerHandle | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.stream.done

    @property
    def pending_token(self) -> int:
        """The last sampled token: not yet in the cache, it is the next step's input."""
        return self.generated[-1]

    def advance(self, logits: np.ndarray) -> TokenEvent:
        """Pick the next token from this row's logits (V,), extend the text, decide whether the sequence ends."""
        token = self.sampler.next_token(logits, self.ids)
        self.ids.append(token)
        self.generated.append(token)
        text = self.detokenizer.step(self.generated)
        if token == self.eos_id:
            self.finish_reason = "eos"
        elif self.detokenizer.stopped:
            self.finish_reason = "stop"
        elif len(self.generated) >= self.limit:
            self.finish_reason = "length"
        if self.finish_reason in ("eos", "length"):
            text += self.detokenizer.flush(self.generated)
        return TokenEvent(len(self.generated) - 1, token, text)

    def result(self, now: float) -> GenerationResult:
        assert self.finish_reason is not None, "result of an unfinished sequence"
        return GenerationResult(
            token_ids=list(self.generated),
            text=self.detokenizer.text,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=len(self.generated),
            time_to_first_token_s=self.first_token_at - self.submitted_at,
            seconds=now - self.submitted_at,
        )


# --- the running batch -----------------------------------------------------------------


class _RunningBatch:
    """The sequences decoding together and their merged cache: row i of the cache is ``rows[i]``.

    Only the engine's executor thread touches it while a step runs.
    """

    def __init__(self, graph: DecoderGraph) -> None:
        self.graph = graph
        self.rows: list[_Sequence] = []
        self.cache: KVCache | None = None

    def prefill(self, newcomers: list[_Sequence]) -> tuple[list[TokenEvent], KVCache]:
        """Run the newcomers' prompts together and pick each one's first token."""
        logits, cache = self.graph.prefill([s.request.prompt_ids for s in newcomers])  # (n, V)
        return [seq.advance(logits[row]) for row, seq in enumerate(newcomers)], cache

    def step(self, joining: list[tuple[list[_Sequence], KVCache]]) -> list[tuple[_Sequence, TokenEvent]]:
        """Leave, join, then one decoding step for every live row; finished rows leave at once."""
        self.leave()
        for seqs, cache in joining:
            self.join(seqs, cache)
        if self.cache is None:
            return []
        tokens = np.array([s.pending_token for s in self.rows], dtype=np.int64)  # (B,)
        logits, self.cache = self.graph.decode(tokens, self.cache)  # (B, V)
        events = [(seq, seq.advance(logits[row])) for row, seq in enumerate(self.rows)]
        self.leave()
        return events

    def join(self, seqs: list[_Sequence], cache: KVCache) -> None:
        """Add prefilled sequences still live, their cache padded on the left to the common width."""
        keep = [row for row, s in enumerate(seqs) if not s.done]
        if not keep:
            return
        if len(keep) < len(seqs):
            cache = cache.select(keep)
        self.rows += [seqs[row] for row in keep]
        self.cache = cache if self.cache is None else KVCache.merge(self.cache, cache)

    def leave(self) -> None:
        """Drop finished and cancelled rows and the cache columns only they needed."""
        keep = [row for row, s in enumerate(self.rows) if not s.done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[row] for row in keep]
        self.cache = self.cache.select(keep) if keep and self.cache is not None else None

    def reset(self) -> list[_Sequence]:
        rows, self.rows, self.cache = self.rows, [], None
        return rows


# --- the engine ------------------------------------------------------------------------


class GenerationEngine:
    """Queue, admission and the decoding loop of one generative model (see the module docstring)."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        max_running: int,
        max_queue_size: int,
        queue_timeout_s: float,
        observer: GenerationObserver | None = None,
    ) -> None:
        assert model.task == "text-generation", f"{model.name} is a {model.task} model, not text-generation"
        assert model.tokenizer is not None, f"{model.name} has no tokenizer"
        assert max_running >= 1, "max_running must be at least 1"
        assert max_queue_size >= 1, "max_queue_size must be at least 1"
        assert queue_timeout_s > 0, "queue_timeout_s must be positive"
        self.name = model.name
        self.tokenizer = model.tokenizer
        manifest = model.manifest
        self.max_context = int(manifest["max_sequence_length"])
        self.eos_id = int(manifest["special_tokens"]["eos"])
        self.vocab_size = int(
            manifest.get("config", {}).get("vocab_size") or model.tokenizer.get_vocab_size()
        )
        self.max_running = max_running
        self.max_queue_size = max_queue_size
        self.queue_timeout_s = queue_timeout_s
        self._hooks = _Hooks(observer)
        self._batch = _RunningBatch(DecoderGraph(model.graphs["model"], manifest))
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: list[_Sequence] = []
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._avg_sequence_s = 0.0
        self.cancelled_sequences = 0

    # --- gauges -------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Sequences admitted (being prefilled or in the batch) and not finished."""
        return sum(not s.done for s in (*self._prefilling, *self._batch.rows))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # --- public API -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the decoding loop on the running event loop; idempotent."""
        if self._closed:
            raise BatcherClosedError(self.name, "stopped")
        if self._worker is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"generation-{self.name}")
        self._worker = asyncio.get_running_loop().create_task(self._run(), name=f"generation-{self.name}")

    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a request and return its stream at once; never waits for room.

        Raises BatcherClosedError when not running, ValueError for a request that
        cannot fit (empty prompt, unknown token ids, no room for one new token), and
        QueueFullError when ``max_queue_size`` requests already wait.
        """
        if self._worker is None or self._closed:
            self._hooks.on_reject("closed")
            raise BatcherClosedError(self.name, "not started" if self._worker is None else "shutting down")
        self._validate(request)
        if len(self._waiting) >= self.max_queue_size:
            self._hooks.on_reject("queue_full")
            raise QueueFullError(self.name, len(self._waiting), self.retry_after_s())
        stream = GenerationStream(request, self.name, self._on_stream_cancel)
        seq = _Sequence(request, stream, self)
        seq.timer = asyncio.get_running_loop().call_later(self.queue_timeout_s, self._expire, seq)
        self._waiting.append(seq)
        self._depth_changed()
        self._wakeup.set()
        return stream

    def admit(self, count: int) -> None:
        """Raise QueueFullError (and count the refusal) unless ``count`` more requests fit the queue now.

        For callers that submit several prompts and want all of them queued or none.
        """
        if self._worker is None or self._closed:
            return  # submit() reports it
        if len(self._waiting) + count > self.max_queue_size:
            self._hooks.on_reject("queue_full")
            raise QueueFullError(self.name, len(self._waiting), self.retry_after_s())

    def retry_after_s(self) -> int:
        """Whole seconds until a slot likely frees: rounds of ``max_running`` ahead x recent sequence time, >= 1."""
        rounds_ahead = math.ceil((len(self._waiting) + 1) / self.max_running)
        return max(1, math.ceil(rounds_ahead * self._avg_sequence_s))

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None:
        """Stop accepting; finish waiting and running sequences (``drain``) within ``timeout_s``.

        Without ``drain`` they fail with BatcherClosedError at once. Whatever is
        unfinished after the deadline fails the same way. The step in flight cannot be
        interrupted; its thread finishes on its own.
        """
        self._closed = True
        if not drain:
            self._fail_all(BatcherClosedError(self.name))
        self._wakeup.set()
        if self._worker is not None and not self._worker.done():
            _, pending = await asyncio.wait({self._worker}, timeout=timeout_s)
            if pending:
                log.warning(
                    "generation %s: stop timed out after %.1fs, failing the rest", self.name, timeout_s
                )
                self._worker.cancel()
                await asyncio.wait({self._worker})
        self._fail_all(BatcherClosedError(self.name, "stopped before the sequence finished"))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # --- admission ----------------------------------------------------------------------------

    def _validate(self, request: GenerationRequest) -> None:
        prompt = request.prompt_ids
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self.max_context:
            raise ValueError(
                f"the prompt is {len(prompt)} tokens; model {self.name!r} holds {self.max_context} tokens "
                "of context, including at least one new token"
            )
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {request.max_new_tokens}")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_size})")

    def _admit(self) -> list[_Sequence]:
        """Take waiting sequences, oldest first, while the batch has room."""
        newcomers: list[_Sequence] = []
        while self._waiting and self.running + len(newcomers) < self.max_running:
            seq = self._waiting.popleft()
            if seq.timer is not None:
                seq.timer.cancel()
            if not seq.done:
                newcomers.append(seq)
        if newcomers:
            self._depth_changed()
        return newcomers

    def _expire(self, seq: _Sequence) -> None:
        """Timer callback: the request waited too long for a place in the batch."""
        if seq not in self._waiting:
            return
        self._waiting.remove(seq)
        self._hooks.on_reject("timeout")
        seq.stream._fail(QueueTimeoutError(self.name, time.monotonic() - seq.submitted_at))
        self._depth_changed()

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

    async def _has_work(self) -> bool:
        """Wait until something waits or runs; False once closed with nothing left."""
        while not (self._waiting or self._batch.rows):
            if self._closed:
                return False
            self._wakeup.clear()
            await self._wakeup.wait()
        return True

    async def _compute(self, fn: Callable[[], Any], batch_size: int) -> Any:
        started = time.monotonic()
        result = await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        self._hooks.on_step(batch_size, time.monotonic() - started)
        return result

    async def _prefill(self, newcomers: list[_Sequence]) -> list[tuple[list[_Sequence], KVCache]]:
        """Prefill the newcomers together; if that fails, each alone, so only a failing prompt fails.

        The running batch goes on either way.
        """
        self._prefilling = newcomers
        try:
            groups = [newcomers]
            joining: list[tuple[list[_Sequence], KVCache]] = []
            while groups:
                group = groups.pop(0)
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
                self._publish(list(zip(group, events, strict=True)))
                joining.append((group, cache))
            return joining
        finally:
            self._prefilling = []

    async def _decode(self, joining: list[tuple[list[_Sequence], KVCache]]) -> None:
        joined = [s for seqs, _ in joining for s in seqs]
        live = sum(not s.done for s in (*self._batch.rows, *joined))
        if not live:  # nothing to compute: just let the finished and cancelled rows go
            self._batch.leave()
            return
        self._publish(await self._compute(lambda: self._batch.step(joining), live))

    def _publish(self, events: list[tuple[_Sequence, TokenEvent]]) -> None:
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
            if seq.finish_reason is not None:
                self._finish(seq, now)

    def _finish(self, seq: _Sequence, now: float) -> None:
        result = seq.result(now)
        seq.stream._finish(result)
        self._hooks.on_finish(result.finish_reason, result.completion_tokens)
        self._avg_sequence_s = (
            result.seconds
            if self._avg_sequence_s == 0
            else _EWMA_ALPHA * result.seconds + (1 - _EWMA_ALPHA) * self._avg_sequence_s
        )
        self._depth_changed()

    def _fail_running(self, error: BaseException) -> None:
        for seq in (*self._prefilling, *self._batch.reset()):
            seq.stream._fail(error)
        self._prefilling = []
        self._depth_changed()

    def _fail_all(self, error: BaseException) -> None:
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
