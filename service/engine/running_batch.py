"""The running batch of continuous batching: the sequences decoding together and their merged KV cache.

``SequenceState`` is one request on the engine's side (sampler, ids, text,
finish); ``RunningBatch`` prefills newcomers, lets them join, runs one decoding
step for every row and drops the rows that finished. Only the engine's compute
thread touches them while a step runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from .decoder_graph import DecoderGraph
from .detokenizer import IncrementalDetokenizer
from .generation_contract import GenerationRequest, GenerationResult, TokenEvent
from .generation_stream import GenerationStream
from .generation_trace import SequenceTrace
from .kv_cache import KVBuffer, KVCache
from .sampling import TokenLogprob, TokenSampler, prompt_token_logprobs, token_logprob


class SequenceState:
    """Engine-side state of one request: sampler, generated ids, text, finish. Advanced in the executor."""

    def __init__(
        self,
        request: GenerationRequest,
        stream: GenerationStream,
        *,
        max_context: int,
        eos_id: int,
        decode: Callable[[list[int]], str],
    ) -> None:
        self.request = request
        self.stream = stream
        self.sampler = TokenSampler(request.sampling)
        self.ids = list(request.prompt_ids)  # prompt + generated: what the repetition penalty looks at
        self.generated: list[int] = []
        self.logprobs: list[TokenLogprob] = []  # with sampling.logprobs: one per generated token
        self.prompt_logprobs: list[TokenLogprob] | None = None  # set by the prefill when asked
        # The one clamp of max_new_tokens: prompt + generated tokens never exceed the position table.
        assert request.sampling.max_new_tokens is not None, "the inference core sets a length"
        self.limit = min(request.sampling.max_new_tokens, max_context - len(request.prompt_ids))
        self.eos_id = eos_id
        self.detokenizer = IncrementalDetokenizer(decode, request.sampling.stop)
        self.finish_reason: str | None = None
        self.submitted_at = time.monotonic()
        self.priority = 1  # scheduling.NORMAL; set by the engine from the request's scheduling
        self.expires_at = float("inf")  # while waiting: the client's deadline, or the queue's timeout
        self.client_deadline = False  # expires_at is the client's: 504, not 503
        self.deadline: float | None = None  # the client's deadline, which also ends a running sequence
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.trace: SequenceTrace | None = None  # with traces on, when its request is sampled

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.stream.done

    @property
    def pending_token(self) -> int:
        """The last sampled token: not yet in the cache, it is the next step's input."""
        return self.generated[-1]

    def advance(self, logits: np.ndarray) -> TokenEvent:
        """Pick the next token from this row's logits (V,), extend the text, decide whether the sequence ends."""
        token = self.sampler.next_token(logits, self.ids, self.generated)
        top_n = self.request.sampling.logprobs
        logprob = token_logprob(logits, token, top_n) if top_n is not None else None
        if logprob is not None:
            self.logprobs.append(logprob)
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
        return TokenEvent(len(self.generated) - 1, token, text, logprob)

    def end_at_deadline(self) -> None:
        """The client's deadline passed while it decoded: it ends now, with what it has."""
        self.finish_reason = "deadline"
        self.detokenizer.flush(self.generated)

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
            logprobs=list(self.logprobs) if self.request.sampling.logprobs is not None else None,
            prompt_logprobs=self.prompt_logprobs,
        )


class RunningBatch:
    """The sequences decoding together and their merged cache: row i of the cache is ``rows[i]``.

    Only the engine's executor thread touches it while a step runs.
    """

    def __init__(self, graph: DecoderGraph) -> None:
        self.graph = graph
        self.rows: list[SequenceState] = []
        self.cache: KVCache | KVBuffer | None = None

    def prefill(self, newcomers: list[SequenceState]) -> tuple[list[TokenEvent], KVCache]:
        """Run the newcomers' prompts together and pick each one's first token (and, when asked, score
        each prompt token from the same forward pass)."""
        logits, cache = self.graph.prefill_all([s.request.prompt_ids for s in newcomers])  # (n, L, V)
        for row, seq in enumerate(newcomers):
            top_n, prompt = seq.request.sampling.prompt_logprobs, seq.request.prompt_ids
            if top_n is not None:
                seq.prompt_logprobs = prompt_token_logprobs(logits[row, -len(prompt) :], prompt, top_n)
        return [seq.advance(logits[row, -1]) for row, seq in enumerate(newcomers)], cache

    def step(
        self, joining: list[tuple[list[SequenceState], KVCache]]
    ) -> list[tuple[SequenceState, TokenEvent]]:
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

    def join(self, seqs: list[SequenceState], cache: KVCache) -> None:
        """Add prefilled sequences still live, their cache padded on the left to the common width."""
        keep = [row for row, s in enumerate(seqs) if not s.done]
        if not keep:
            return
        if len(keep) < len(seqs):
            cache = cache.select(keep)
        self.rows += [seqs[row] for row in keep]
        self.cache = self.graph.start(cache) if self.cache is None else self.cache.extend(cache)

    def leave(self) -> None:
        """Drop finished and cancelled rows and the cache columns only they needed."""
        keep = [row for row, s in enumerate(self.rows) if not s.done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[row] for row in keep]
        self.cache = self.cache.keep(keep) if keep and self.cache is not None else None

    def reset(self) -> list[SequenceState]:
        rows, self.rows, self.cache = self.rows, [], None
        return rows
