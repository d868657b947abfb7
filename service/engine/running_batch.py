"""The running batch of continuous batching: the sequences decoding together and their merged KV cache.

``SequenceState`` is one request on the engine's side (sampler, ids, text,
finish); ``RunningBatch`` prefills newcomers, lets them join, runs one decoding
step for every row and drops the rows that finished. Only the engine's compute
thread touches them while a step runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .decoder_graph import DecoderGraph
from .detokenizer import IncrementalDetokenizer
from .device_kv import DeviceKVBuffer
from .generation_contract import GenerationRequest, GenerationResult, TokenEvent
from .generation_stream import GenerationStream
from .generation_trace import SequenceTrace
from .kv_cache import KVBuffer, KVCache, to_host
from .prefix_cache import PrefixCache
from .sampling import TokenLogprob, TokenSampler, prompt_token_logprobs, token_logprob
from .scheduling import Share
from .speculation import Speculation, propose
from .structured_output import Grammar, GrammarCompiler

log = logging.getLogger(__name__)


class SequenceState:
    """Engine-side state of one request: sampler, generated ids, text, finish. Advanced in the executor."""

    def __init__(
        self,
        request: GenerationRequest,
        stream: GenerationStream,
        *,
        max_context: int,
        eos_id: int,
        vocab_size: int,
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
        self.vocab_size = vocab_size
        self.detokenizer = IncrementalDetokenizer(decode, request.sampling.stop)
        self.finish_reason: str | None = None
        self.submitted_at = time.monotonic()
        self.priority = 1  # scheduling.NORMAL; set by the engine from the request's scheduling
        self.most_urgent = 0  # the class aging may lift it to while it waits: its key's ceiling
        self.share = Share()  # its request's, set by the engine: the request's sequences share admission
        self.expires_at = float("inf")  # while waiting: the client's deadline, or the queue's timeout
        self.client_deadline = False  # expires_at is the client's: 504, not 503
        self.deadline: float | None = None  # the client's deadline, which also ends a running sequence
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.trace: SequenceTrace | None = None  # with traces on, when its request is sampled
        self.grammar: Grammar | None = None  # with structured_outputs: set when it is prefilled

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.stream.done

    @property
    def pending_token(self) -> int:
        """The last sampled token: not yet in the cache, it is the next step's input."""
        return self.generated[-1]

    def allowed(self, grammar_mask: np.ndarray | None = None) -> np.ndarray | None:
        """The tokens this step may pick, as a boolean (V,) mask, or None for all: the grammar's mask,
        and before ``min_tokens`` no end of text (unless the grammar allows nothing else)."""
        if grammar_mask is not None and not grammar_mask.any():  # a grammar with nowhere to go: it ends here
            grammar_mask = np.zeros(self.vocab_size, dtype=bool)
            grammar_mask[self.eos_id] = True
        if len(self.generated) >= self.request.sampling.min_tokens:
            return grammar_mask
        allowed = np.ones(self.vocab_size, dtype=bool) if grammar_mask is None else grammar_mask.copy()
        allowed[self.eos_id] = False
        return allowed if allowed.any() else grammar_mask

    def advance(self, logits: np.ndarray, grammar_mask: np.ndarray | None = None) -> TokenEvent:
        """Pick the next token from this row's logits (V,) (within its grammar's mask, when constrained),
        extend the text, decide whether the sequence ends."""
        token = self.sampler.next_token(logits, self.ids, self.generated, self.allowed(grammar_mask))
        return self.take(token, logits)

    def accept(
        self, logits: np.ndarray, proposal: list[int], grammar_mask: np.ndarray | None = None
    ) -> tuple[list[TokenEvent], int]:
        """Speculative decoding: ``logits`` (1 + len(proposal), V) are the model's after the pending token
        and after each proposed one. Take the proposed tokens while they pass ``TokenSampler.verify``,
        then one token of its own (the correction, or the next one after a proposal accepted whole), until
        the sequence ends. Returns the events and how many proposed tokens were kept."""
        events: list[TokenEvent] = []
        for j in range(len(proposal) + 1):
            mask = grammar_mask if j == 0 else None  # constrained rows propose nothing: only j == 0
            scores = self.sampler.scores(logits[j], self.ids, self.generated, self.allowed(mask))
            if j < len(proposal):
                token, kept = self.sampler.verify(scores, proposal[j])
            else:
                token, kept = self.sampler.pick(scores), False
            events.append(self.take(token, logits[j]))
            if not kept or self.finish_reason is not None:
                return events, j + int(kept)
        return events, len(proposal)

    def take(self, token: int, logits: np.ndarray) -> TokenEvent:
        """Append the chosen ``token`` (picked from ``logits``, which its logprobs are read from), extend the
        text, decide whether the sequence ends."""
        top_n = self.request.sampling.logprobs
        logprob = token_logprob(logits, token, top_n) if top_n is not None else None
        if logprob is not None:
            self.logprobs.append(logprob)
        self.ids.append(token)
        self.generated.append(token)
        stop_allowed = len(self.generated) >= self.request.sampling.min_tokens
        text = self.detokenizer.step(self.generated, stop_allowed)
        complete = False  # the grammar takes no further token: the text is whole
        broken = False  # the grammar failed (a limit of llguidance's): the text is not whole, however it ends
        if self.grammar is not None:
            if token != self.eos_id and not self.grammar.consume(token):  # the sequence ends, not the batch
                log.warning("a grammar refused token %d (%s): the sequence ends", token, self.grammar.error)
            complete = self.grammar.finished
            broken = self.grammar.failed or (token == self.eos_id and not self.grammar.accepting)
        if broken:  # stop only for a text the grammar accepts whole
            self.finish_reason = "length"
        elif token == self.eos_id:
            self.finish_reason = "eos"
        elif self.detokenizer.stopped:
            self.finish_reason = "stop"
        elif complete:
            self.finish_reason = "stop"
            text += self.detokenizer.flush(self.generated)
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


# Up to this many rows, speculative steps check each row in place (one model call per row, GroupQueryAttention's
# rule); above, one call for the batch through the Concat graph. Measured on the default GPT, 2 cores, with
# the copying task: at 3 rows in place 1.29x against 1.09x through the Concat graph, at 4 rows 1.02x either way.
IN_PLACE_VERIFY_ROWS = 4


class RunningBatch:
    """The sequences decoding together and their merged cache: row i of the cache is ``rows[i]``.

    Only the engine's executor thread touches it while a step runs.
    """

    def __init__(
        self,
        graph: DecoderGraph,
        grammars: GrammarCompiler | None = None,
        prefix_cache: PrefixCache | None = None,
        speculation: Speculation | None = None,
    ) -> None:
        self.graph = graph
        self.grammars = grammars
        self.prefix_cache = prefix_cache
        self.speculation = speculation
        self.proposed_tokens = 0  # speculation: tokens proposed, and of those, kept
        self.accepted_tokens = 0
        self.rows: list[SequenceState] = []
        self.cache: KVCache | KVBuffer | DeviceKVBuffer | None = None
        self._masker: ThreadPoolExecutor | None = None  # computes grammar masks while the model runs
        self.mask_seconds = 0.0  # computing masks, in all
        self.mask_wait_seconds = 0.0  # of that, what the step waited for after the model call

    def _start_masks(self, seqs: Sequence[SequenceState]) -> Future[list[np.ndarray | None]] | None:
        """The grammar masks of ``seqs``' constrained rows, all in one llguidance call (None when no row is
        constrained). On CUDA they are computed on another thread while the model runs; on CPU right away:
        ONNX Runtime's threads already take every core, and a thread beside them cost a step more than the
        masks themselves (measured: ``benchmarks/generation_features.py``)."""
        rows = [(row, s.grammar) for row, s in enumerate(seqs) if s.grammar is not None and not s.done]
        if not rows:
            return None
        assert self.grammars is not None, "a constrained sequence without a grammar compiler"
        grammars = self.grammars

        def masks() -> list[np.ndarray | None]:
            started = time.perf_counter()
            allowed = grammars.masks([g for _, g in rows])  # (constrained rows, V)
            out: list[np.ndarray | None] = [None] * len(seqs)
            for i, (row, _) in enumerate(rows):
                out[row] = allowed[i]
            self.mask_seconds += time.perf_counter() - started
            return out

        if self.graph.on_cuda:
            if self._masker is None:
                self._masker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
            return self._masker.submit(masks)
        done: Future[list[np.ndarray | None]] = Future()
        started = time.perf_counter()
        done.set_result(masks())
        self.mask_wait_seconds += time.perf_counter() - started  # the step waited for all of it
        return done

    def _masks(self, pending: Future[list[np.ndarray | None]] | None, rows: int) -> list[np.ndarray | None]:
        if pending is None:
            return [None] * rows
        if pending.done():  # computed right away (and counted then)
            return pending.result()
        started = time.perf_counter()
        masks = pending.result()
        self.mask_wait_seconds += time.perf_counter() - started
        return masks

    def _cacheable(self, seq: SequenceState) -> bool:
        """Whether ``seq`` may reuse cached blocks: not when every prompt position's logits are asked for."""
        return self.prefix_cache is not None and seq.request.sampling.prompt_logprobs is None

    def prefill_groups(self, newcomers: list[SequenceState]) -> list[list[SequenceState]]:
        """The newcomers in the groups to prefill together: those that find a cached prefix, and the
        others (a prompt computed whole would make a group's rows compute as much)."""
        if self.prefix_cache is None:
            return [newcomers]
        cache = self.prefix_cache
        hits = [
            s
            for s in newcomers
            if self._cacheable(s) and cache.reusable(s.request.prompt_ids, s.request.cache_salt)
        ]
        misses = [s for s in newcomers if s not in hits]
        return [group for group in (hits, misses) if group]

    def prefill(self, newcomers: list[SequenceState]) -> tuple[list[TokenEvent], KVCache]:
        """Run the newcomers' prompts together (each after the longest prefix the prefix cache holds) and
        pick each one's first token (and, when asked, score each prompt token from the same forward pass);
        their full blocks go into the prefix cache."""
        for seq in newcomers:
            structured = seq.request.sampling.structured_outputs
            if structured is not None and seq.grammar is None:
                assert self.grammars is not None, "structured output without a grammar compiler"
                seq.grammar = self.grammars.start(structured)
        prompts = [s.request.prompt_ids for s in newcomers]
        reused, prefixes = self._reuse(newcomers)
        pending = self._start_masks(newcomers)
        logits, cache = self.graph.prefill_all(prompts, reused, prefixes)  # (n, T, V)
        masks = self._masks(pending, len(newcomers))
        if self.prefix_cache is not None:
            host = [to_host(t) for t in cache.tensors]
            for row, (seq, prompt) in enumerate(zip(newcomers, prompts, strict=True)):
                self.prefix_cache.store(prompt, host, row, cache.width, seq.request.cache_salt)
        for row, seq in enumerate(newcomers):
            top_n, prompt = seq.request.sampling.prompt_logprobs, seq.request.prompt_ids
            if top_n is not None:
                seq.prompt_logprobs = prompt_token_logprobs(logits[row, -len(prompt) :], prompt, top_n)
        return [seq.advance(logits[row, -1], masks[row]) for row, seq in enumerate(newcomers)], cache

    def _reuse(self, newcomers: list[SequenceState]) -> tuple[list[int], list[np.ndarray | None]]:
        """Tokens each newcomer reuses from the prefix cache, and their keys/values. A group computes as
        many new tokens as its longest rest, so a row reuses only what leaves it exactly that many."""
        n = len(newcomers)
        if self.prefix_cache is None:
            return [0] * n, [None] * n
        cache = self.prefix_cache
        prompts = [s.request.prompt_ids for s in newcomers]
        available = [
            cache.reusable(p, s.request.cache_salt) if self._cacheable(s) else 0
            for s, p in zip(newcomers, prompts, strict=True)
        ]
        new = max(len(p) - a for p, a in zip(prompts, available, strict=True))
        reused = [max(0, len(p) - new) for p in prompts]
        prefixes: list[np.ndarray | None] = []
        for seq, prompt, r in zip(newcomers, prompts, reused, strict=True):
            if r:
                prefixes.append(cache.lookup(prompt, r, seq.request.cache_salt))
            else:
                cache.missed(prompt)
                prefixes.append(None)
        return reused, prefixes

    def step(
        self, joining: list[tuple[list[SequenceState], KVCache]]
    ) -> list[tuple[SequenceState, TokenEvent]]:
        """Leave, join, then one decoding step for every live row; finished rows leave at once."""
        self.leave()
        for seqs, cache in joining:
            self.join(seqs, cache)
        if self.cache is None:
            return []
        pending = self._start_masks(self.rows)
        proposals = self._proposals()
        if any(proposals):
            events = self._speculative_step(proposals, pending)
        else:
            tokens = np.array([s.pending_token for s in self.rows], dtype=np.int64)  # (B,)
            logits, self.cache = self.graph.decode(tokens, self.cache)  # (B, V)
            masks = self._masks(pending, len(self.rows))
            events = [(seq, seq.advance(logits[row], masks[row])) for row, seq in enumerate(self.rows)]
        self.leave()
        return events

    def _proposals(self) -> list[list[int]]:
        """Each row's n-gram proposal (none: speculation off, more live rows than ``max_rows``, a constrained
        or finished row, or no match). A row proposes at most one token fewer than it still may generate."""
        spec = self.speculation
        if spec is None or sum(not s.done for s in self.rows) > spec.max_rows:
            return [[] for _ in self.rows]
        return [
            propose(s.ids, spec, s.limit - len(s.generated) - 1) if s.grammar is None and not s.done else []
            for s in self.rows
        ]

    def _speculative_step(
        self, proposals: list[list[int]], pending: Future[list[np.ndarray | None]] | None
    ) -> list[tuple[SequenceState, TokenEvent]]:
        """One model call over every row's pending token and proposal; each row keeps what it accepts."""
        assert self.cache is not None
        width = 1 + max(map(len, proposals))
        tokens = np.zeros((len(self.rows), width), dtype=np.int64)  # (B, 1 + K)
        for row, (seq, proposal) in enumerate(zip(self.rows, proposals, strict=True)):
            tokens[row, : 1 + len(proposal)] = [seq.pending_token, *proposal]
        counts = np.array([1 + len(p) for p in proposals], dtype=np.int64)
        in_place = isinstance(self.cache, KVBuffer) and self.graph.verifies_in_place
        if in_place and len(self.rows) <= IN_PLACE_VERIFY_ROWS:  # one call per row, no copy of any past
            assert isinstance(self.cache, KVBuffer)
            rows = [
                self.graph.verify_row(tokens[row, :count], self.cache, row)
                for row, count in enumerate(counts)
            ]
            logits = np.zeros((len(rows), width, rows[0].shape[-1]), rows[0].dtype)
            for row, row_logits in enumerate(rows):
                logits[row, : len(row_logits)] = row_logits
            present: list[np.ndarray] | None = None
            past_width = 0
        else:  # one call for the batch, over the pasts gathered for the Concat graph
            logits, present, past_width = self.graph.verify(tokens, counts, self.cache)  # (B, 1 + K, V)
        masks = self._masks(pending, len(self.rows))
        events: list[tuple[SequenceState, TokenEvent]] = []
        keep = []
        for row, (seq, proposal) in enumerate(zip(self.rows, proposals, strict=True)):
            if seq.done:  # cancelled meanwhile: it leaves at once, whatever its cache holds
                keep.append(1)
                continue
            taken, accepted = seq.accept(logits[row], proposal, masks[row])
            events += [(seq, event) for event in taken]
            keep.append(1 + accepted)  # the pending token and the proposed ones kept: now in the cache
            self.proposed_tokens += len(proposal)
            self.accepted_tokens += accepted
        if present is None:  # verified in place: the kept columns are already in the buffer
            assert isinstance(self.cache, KVBuffer)
            self.cache.lengths = self.cache.lengths + np.asarray(keep, dtype=np.int64)
        else:
            self.cache = self.graph.commit(self.cache, present, past_width, keep)
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
