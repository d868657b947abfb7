"""Encoder-decoder decoding with the KV cache: batched greedy search and beam search.

The encoder graph runs once per batch and returns every decoder layer's
cross-attention keys/values; each decoder step then feeds one new token per
row with the self-attention cache from the previous step. Greedy rows that
reach </s> leave the batch at once (their caches are dropped), so a batch
costs what its longest live row costs, not more.

Beam search keeps `beam_size` rows per request, scores finished hypotheses
with a length penalty (sum of log-probs / length ** alpha, as in GNMT / HF),
and stops a request when no live beam can beat its worst kept hypothesis.

With an in-place step graph for the decoder (``LoadedModel.inplace``), the
self-attention cache is a ``KVBuffer`` as long as the call's step limit, which
each step writes its new column into instead of concatenating; rows leave by
``keep`` and beams are regrouped by ``reorder`` (a gather of the valid prefix,
as any beam search must copy).

CTranslate2's decoding controls (``translate_batch``) are per row (``RowControls``), so a row with a forced
target prefix, a minimum length or a repetition penalty shares the batch with free rows, which decode
exactly as they would alone: a forced prefix, ``min_decoding_length``, ``no_repeat_ngram_size``,
``repetition_penalty`` (CTRL's, on the logits of the tokens already in the output) and
``suppress_sequences``, and for ``return_alternatives`` the rank of the token a row takes at the first
position after its prefix (``pick``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .decoder_graph import inplace_step
from .kv_cache import CacheLayout, KVBuffer
from .manifest import Manifest, required
from .runtime import Graph
from .sampling import logprobs


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without <s> and </s>
    logprob: float  # sum of token log-probabilities, </s> included when finished
    score: float  # logprob / length ** length_penalty
    finished: bool  # ended with </s> (else cut by max_new_tokens)
    token_logprobs: list[float] | None = None  # scored (``score``): each token's, </s> last


@dataclass
class _RequestBeams:
    """Finished hypotheses of one request, best first, at most `size` kept."""

    size: int
    length_penalty: float
    done: list[Hypothesis] = field(default_factory=list)

    def add(self, tokens: list[int], logprob: float, finished: bool) -> None:
        length = len(tokens) + (1 if finished else 0)
        score = logprob / max(length, 1) ** self.length_penalty
        self.done.append(Hypothesis(tokens, logprob, score, finished))
        self.done.sort(key=lambda h: h.score, reverse=True)
        del self.done[self.size :]

    def is_done(self, best_live_logprob: float, length: int) -> bool:
        if len(self.done) < self.size:
            return False
        # The usual heuristic (HF's early_stopping=False): judge the best live beam at its current length.
        return best_live_logprob / max(length, 1) ** self.length_penalty <= self.done[-1].score


@dataclass(frozen=True)
class RowControls:
    """One row's CTranslate2 controls; the defaults change nothing."""

    prefix: tuple[int, ...] = ()  # forced first tokens (target_prefix); part of the output and its score
    min_length: int = 0  # no </s> before this many tokens (min_decoding_length)
    no_repeat_ngram_size: int = 0  # no n-gram of this size twice in the output (0: off)
    repetition_penalty: float = 1.0  # logits of tokens already in the output: / p if positive, * p if not
    suppress_sequences: tuple[tuple[int, ...], ...] = ()  # never produced (a sequence: its last token banned)
    pick: int = 0  # at the first position after the prefix, the pick-th most likely token (0: the best)

    @property
    def free(self) -> bool:
        return self == FREE


FREE = RowControls()


def _banned_ngrams(history: list[int], n: int) -> list[int]:
    """Tokens that would repeat an n-gram of ``history`` after its last n - 1 tokens."""
    if n <= 0 or len(history) < n - 1:
        return []
    if n == 1:
        return list(set(history))
    tail = tuple(history[len(history) - n + 1 :])
    return [history[i + n - 1] for i in range(len(history) - n + 1) if tuple(history[i : i + n - 1]) == tail]


SelfCache = list[np.ndarray] | KVBuffer  # the decoder's past: Concat tensors, or a buffer updated in place


class Seq2SeqModel:
    def __init__(
        self, encoder: Graph, decoder: Graph, manifest: Manifest, inplace: Graph | None = None
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self.pad_id, self.eos_id = manifest.token("pad"), manifest.token("eos")
        self.bos_id = manifest.decoder_start
        self.suppressed = np.array(manifest.suppress_tokens, dtype=np.int64)
        self.forced_eos = manifest.forced_eos
        self.layout = CacheLayout.of(required(manifest.kv_cache))
        cross = required(manifest.cross_attention)
        self.cross_names = cross.names
        self.cross_mask_name = cross.mask_input
        self.max_target_length = required(manifest.max_target_length)
        self.max_position = required(manifest.max_sequence_length)
        self._inplace = inplace_step(inplace, self.layout) if inplace is not None else None

    @property
    def in_place(self) -> bool:
        return self._inplace is not None

    def _empty(self, rows: int, limit: int) -> SelfCache:
        """The first step's past: a buffer of ``limit`` columns (the last step writes column limit - 1)."""
        if self._inplace is not None:
            return KVBuffer.empty(self.layout, max(limit, 1), rows)
        return self.layout.empty(rows)

    @staticmethod
    def _rows(cache: SelfCache, rows: np.ndarray) -> SelfCache:
        """Row i of the result is row ``rows[i]``: leaving rows (ascending) or regrouped beams."""
        if isinstance(cache, KVBuffer):
            return cache.reorder(rows)
        return [p[rows] for p in cache]

    def encode(self, sources: list[list[int]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Right-padded source batch -> cross-attention keys/values by name, and the source mask."""
        length = max(map(len, sources))
        ids = np.full((len(sources), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(sources), length), dtype=np.int64)
        for i, src in enumerate(sources):
            ids[i, : len(src)] = src
            mask[i, : len(src)] = 1
        cross = self.encoder.run({"input_ids": ids, "attention_mask": mask})
        return dict(zip(self.cross_names, cross, strict=True)), mask

    def _step(
        self,
        tokens: np.ndarray,
        step: int,
        src_mask: np.ndarray,
        cross: dict[str, np.ndarray],
        past: SelfCache,
    ) -> tuple[np.ndarray, SelfCache]:
        """One decoder step for every row: (rows,) new tokens -> logits (rows, V) and the grown cache."""
        rows = len(tokens)
        if isinstance(past, KVBuffer):
            assert self._inplace is not None, "a KVBuffer needs the in-place step graph"
            logits = self._inplace(tokens, past, {self.cross_mask_name: src_mask, **cross})
            return logits[:, -1, :], past
        feeds = {
            "input_ids": tokens.reshape(rows, 1).astype(np.int64),
            "attention_mask": np.ones((rows, step + 1), dtype=np.int64),
            "position_ids": np.full((rows, 1), step, dtype=np.int64),
            self.cross_mask_name: src_mask,
            **cross,
            **dict(zip(self.layout.past_names, past, strict=True)),
        }
        out = self.decoder.run(feeds)
        return out[0][:, -1, :], out[1:]

    def _scores(
        self, logits: np.ndarray, histories: list[list[int]], controls: list[RowControls] | None
    ) -> np.ndarray:
        """Each row's log-probabilities for its next token, its controls applied (``histories``: the tokens
        each row has produced so far)."""
        if controls is None:
            return self._suppress(logprobs(logits))
        logits = np.array(logits, dtype=np.float64)
        for r, c in enumerate(controls):
            if c.repetition_penalty != 1.0 and histories[r]:
                seen = np.unique(np.array(histories[r], dtype=np.int64))
                v = logits[r, seen]
                logits[r, seen] = np.where(v > 0, v / c.repetition_penalty, v * c.repetition_penalty)
        lp = self._suppress(logprobs(logits))
        for r, c in enumerate(controls):
            if c.free:
                continue
            history = histories[r]
            t = len(history)
            if t < len(c.prefix):  # forced: only the prefix's token, at its own log-probability
                token = c.prefix[t]
                kept = lp[r, token]
                lp[r] = -np.inf
                lp[r, token] = kept
                continue
            if t < c.min_length:
                lp[r, self.eos_id] = -np.inf
            banned = _banned_ngrams(history, c.no_repeat_ngram_size)
            for seq in c.suppress_sequences:
                if len(seq) == 1 or (t >= len(seq) - 1 and tuple(history[t - len(seq) + 1 :]) == seq[:-1]):
                    banned.append(seq[-1])
            if banned:
                lp[r, banned] = -np.inf
        return lp

    def _last_step(self, lp: np.ndarray, step: int, limit: int) -> np.ndarray:
        """With ``forced_eos``, the step the limit allows last scores only eos, at 0 (transformers' own)."""
        if not self.forced_eos or step != limit - 1:
            return lp
        forced = np.full_like(lp, -np.inf)
        forced[:, self.eos_id] = 0.0
        return forced

    def _last_steps(self, lp: np.ndarray, step: int, limits: np.ndarray) -> np.ndarray:
        """``_last_step`` for rows of their own limits (``limits``: each live row's)."""
        if not self.forced_eos:
            return lp
        last = np.flatnonzero(limits - 1 == step)
        if last.size:
            lp[last] = -np.inf
            lp[last, self.eos_id] = 0.0
        return lp

    def _suppress(self, lp: np.ndarray) -> np.ndarray:
        """Tokens never generated get -inf after the log-softmax, as transformers' bad_words_ids does."""
        if self.suppressed.size:
            lp[:, self.suppressed] = -np.inf
        return lp

    @property
    def max_new_tokens(self) -> int:
        """The most tokens a translation can have: the target length, and one position left for </s>."""
        return max(1, min(self.max_target_length, self.max_position - 1))

    def _checked(self, max_new_tokens: int) -> int:
        """The caller's step limit, already capped (``pipelines.translate.prepare_source``)."""
        assert max_new_tokens <= self.max_new_tokens, (
            f"max_new_tokens {max_new_tokens}: the model's target length allows at most {self.max_new_tokens}"
        )
        return max_new_tokens

    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]:
        """CTranslate2's ``score_batch``: each target's token log-probabilities given its source, teacher-forced
        in one decoder call (no past; the graph's causal mask keeps each position to the tokens before it),
        </s> last. The same log-softmax (and suppressed tokens) as decoding's, so a translation decoding
        produced scores what decoding summed for it."""
        cross, src_mask = self.encode(sources)
        rows, length = len(targets), max(map(len, targets)) + 1
        ids = np.full((rows, length), self.pad_id, dtype=np.int64)
        for i, target in enumerate(targets):
            ids[i, : len(target) + 1] = [self.bos_id, *target]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((rows, length), dtype=np.int64),
            "position_ids": np.tile(np.arange(length, dtype=np.int64), (rows, 1)),
            self.cross_mask_name: src_mask,
            **cross,
            **dict(zip(self.layout.past_names, self.layout.empty(rows), strict=True)),
        }
        lp = self._suppress(logprobs(self.decoder.run(feeds)[0]).reshape(rows * length, -1)).reshape(
            rows, length, -1
        )
        out = []
        for i, target in enumerate(targets):
            produced = [*target, self.eos_id]
            out.append(lp[i, np.arange(len(produced)), produced])
        return out

    def greedy(
        self,
        sources: list[list[int]],
        max_new_tokens: int | list[int],
        controls: list[RowControls] | None = None,
    ) -> list[Hypothesis]:
        """``max_new_tokens``: one limit for every row, or one per row (a row leaves at its own, so rows of
        different limits share the call and each decodes as it would alone); ``controls``: one per source
        (None: every row free)."""
        if controls is not None and all(c.free for c in controls):
            controls = None
        cross, src_mask = self.encode(sources)
        n = len(sources)
        live = np.arange(n)  # original row of each live row
        tokens = np.full(n, self.bos_id, dtype=np.int64)
        limits = np.array([max_new_tokens] * n if isinstance(max_new_tokens, int) else max_new_tokens)
        limit = self._checked(int(limits.max()))
        past = self._empty(n, limit)
        generated: list[list[int]] = [[] for _ in range(n)]
        total = np.zeros(n)
        results: list[Hypothesis | None] = [None] * n
        for step in range(limit):
            logits, past = self._step(tokens, step, src_mask, cross, past)
            rows = None if controls is None else [controls[row] for row in live]
            lp = self._scores(logits, [generated[row] for row in live] if rows else [], rows)
            lp = self._last_steps(lp, step, limits[live])
            tokens = lp.argmax(-1)
            for r, c in enumerate(rows or ()):
                if c.pick and step == len(c.prefix):  # return_alternatives: this row's rank at the branch
                    tokens[r] = int(np.argsort(-lp[r], kind="stable")[c.pick])
            keep = []
            for r, row in enumerate(live):
                total[row] += lp[r, tokens[r]]
                if tokens[r] == self.eos_id:
                    results[row] = Hypothesis(generated[row], float(total[row]), 0.0, True)
                else:
                    generated[row].append(int(tokens[r]))
                    if step + 1 < limits[row]:
                        keep.append(r)
                    else:  # its own step limit
                        results[row] = Hypothesis(generated[row], float(total[row]), 0.0, False)
            if len(keep) < len(live):  # finished rows leave the batch
                idx = np.array(keep, dtype=np.int64)
                live, tokens, src_mask = live[idx], tokens[idx], src_mask[idx]
                cross = {k: v[idx] for k, v in cross.items()}
                past = self._rows(past, idx)
            if not len(live):
                break
        for row in live:
            results[row] = Hypothesis(generated[row], float(total[row]), 0.0, False)
        final = [h for h in results if h is not None]
        for h in final:
            h.score = h.logprob / max(len(h.tokens) + h.finished, 1)
        return final

    def beam_search(
        self,
        sources: list[list[int]],
        beam_size: int,
        max_new_tokens: int,
        length_penalty: float = 1.0,
        num_return: int = 1,
        controls: list[RowControls] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per request, the `num_return` best hypotheses (by length-penalised score), best first;
        ``controls``: one per source (None: every row free), each applied to all of its beams."""
        if controls is not None and all(c.free for c in controls):
            controls = None
        assert 1 <= num_return <= beam_size, (
            f"num_return {num_return} must be within 1..beam_size {beam_size}"
        )
        n, k = len(sources), beam_size
        cross, src_mask = self.encode(sources)
        cross = {name: np.repeat(v, k, axis=0) for name, v in cross.items()}  # (n * k, H, S, Dh)
        src_mask = np.repeat(src_mask, k, axis=0)
        limit = self._checked(max_new_tokens)
        past = self._empty(n * k, limit)
        beam_logprob = np.full((n, k), -np.inf)
        beam_logprob[:, 0] = 0.0  # one live beam per request at the start
        beam_tokens: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
        tokens = np.full(n * k, self.bos_id, dtype=np.int64)
        finished = [_RequestBeams(k, length_penalty) for _ in range(n)]
        closed = np.zeros(n, dtype=bool)
        beam_controls = None if controls is None else [c for c in controls for _ in range(k)]
        for step in range(limit):
            logits, past = self._step(tokens, step, src_mask, cross, past)
            histories = [] if controls is None else [beam_tokens[i // k][i % k] for i in range(n * k)]
            lp = self._scores(logits, histories, beam_controls)
            lp = self._last_step(lp, step, limit)
            vocab = lp.shape[-1]
            candidates = (beam_logprob[:, :, None] + lp.reshape(n, k, vocab)).reshape(n, k * vocab)
            top = np.argsort(-candidates, axis=1)[:, : 2 * k]  # enough to refill k beams after </s> picks
            source_rows = np.zeros(n * k, dtype=np.int64)
            next_tokens = np.full(n * k, self.pad_id, dtype=np.int64)
            next_logprob = np.full((n, k), -np.inf)
            next_beam_tokens: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
            for r in range(n):
                if closed[r]:
                    source_rows[r * k : (r + 1) * k] = r * k
                    continue
                filled = 0
                for flat in top[r]:
                    score = candidates[r, flat]
                    if not np.isfinite(score):
                        break
                    beam, token = divmod(int(flat), vocab)
                    if token == self.eos_id:
                        finished[r].add(beam_tokens[r][beam], float(score), True)
                        continue
                    source_rows[r * k + filled] = r * k + beam
                    next_tokens[r * k + filled] = token
                    next_logprob[r, filled] = score
                    next_beam_tokens[r][filled] = [*beam_tokens[r][beam], token]
                    filled += 1
                    if filled == k:
                        break
                if filled == 0 or finished[r].is_done(float(next_logprob[r].max()), step + 1):
                    closed[r] = True
            if closed.all():
                break
            past = self._rows(past, source_rows)
            tokens, beam_logprob, beam_tokens = next_tokens, next_logprob, next_beam_tokens
        # Rows cut by the length limit: their live beams compete with the finished ones.
        for row in np.flatnonzero(~closed).tolist():
            for b in range(k):
                if np.isfinite(beam_logprob[row, b]):
                    finished[row].add(beam_tokens[row][b], float(beam_logprob[row, b]), False)
        return [f.done[:num_return] for f in finished]
