"""Generation parameters and token selection: repetition, presence and frequency penalties, greedy,
temperature, top-k, top-p (numpy); and the log-probabilities reported with each token.

One ``TokenSampler`` per sequence, each with its own random generator, so a seeded
sequence draws the same tokens whichever other sequences share its batch.

Reported log-probabilities are vLLM's default ("raw"): the log-softmax of the
model's own logits, before penalties, temperature and top-k/top-p. They describe
the model, whatever the sampling settings, and a prompt token's value is
comparable with a generated token's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .structured_output import StructuredOutput

__all__ = [
    "SamplingParams",
    "TokenLogprob",
    "TokenSampler",
    "logprobs",
    "prompt_token_logprobs",
    "softmax",
    "token_logprob",
]


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is generated (vLLM's ``SamplingParams``): how many tokens, where to stop, how to pick.

    ``temperature == 0`` (or ``greedy=True``) means argmax. ``top_k == 0`` and
    ``top_p == 1`` switch those filters off; ``repetition_penalty == 1`` and
    ``presence_penalty == frequency_penalty == 0`` switch the penalties off. ``seed``
    makes sampling reproducible. ``max_new_tokens`` is also bounded by the model's
    context (the engine ends the sequence there, finish ``length``); the text is cut
    before the first of the ``stop`` strings.

    ``logprobs`` (None = off) reports each generated token's log-probability and the
    ``logprobs`` most likely alternatives; ``prompt_logprobs`` the same for every
    prompt token after the first (one more forward pass over the prompt).

    ``logit_bias`` adds a value to a token's logit before anything else (OpenAI's: -100 bans a
    token in practice, 100 all but forces it); ``min_tokens`` forbids the end of text (and stop
    strings) until that many tokens are generated (vLLM's). ``structured_outputs`` keeps the
    text inside a grammar (``structured_output.py``).
    """

    max_new_tokens: int | None = None  # None: the service's default (the inference core fills it in)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    greedy: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), each id once
    min_tokens: int = 0
    structured_outputs: StructuredOutput | None = None

    def __post_init__(self) -> None:
        assert self.max_new_tokens is None or self.max_new_tokens >= 1, (
            f"max_new_tokens must be >= 1, got {self.max_new_tokens}"
        )
        assert self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"
        assert self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"
        assert 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"
        assert self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"
        assert self.logprobs is None or self.logprobs >= 0, f"logprobs must be >= 0, got {self.logprobs}"
        assert self.prompt_logprobs is None or self.prompt_logprobs >= 0, (
            f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}"
        )
        assert self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"
        assert len({token for token, _ in self.logit_bias}) == len(self.logit_bias), "a token biased twice"

    def for_choice(self, choice: int) -> SamplingParams:
        """Choice ``choice`` of several per prompt: a seeded request samples it with ``seed + choice``."""
        if choice == 0 or self.seed is None:
            return self
        return dataclasses.replace(self, seed=self.seed + choice)

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding: asked for, temperature 0, or top-k 1 (a one-token set leaves nothing to draw)."""
        return self.greedy or self.temperature == 0 or self.top_k == 1

    @property
    def is_deterministic(self) -> bool:
        """Same request, same output: greedy or seeded. Only these may be cached."""
        return self.is_greedy or self.seed is not None


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64, max-subtracted so large logits cannot overflow."""
    x = np.asarray(logits, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def logprobs(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis in float64 (stable: no exp of large values, no log of 0 from underflow)."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def apply_logit_bias(scores: np.ndarray, bias: Sequence[tuple[int, float]]) -> np.ndarray:
    """OpenAI's ``logit_bias``: each (token, value) adds ``value`` to that token's logit. In place."""
    for token, value in bias:
        scores[token] += value
    return scores


def apply_repetition_penalty(scores: np.ndarray, previous_ids: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL / HF rule: for tokens already present, divide positive logits by ``penalty``, multiply negative ones.

    Both directions make a seen token less likely when ``penalty > 1``. Modifies ``scores`` in place.
    """
    if penalty == 1.0 or len(previous_ids) == 0:
        return scores
    ids = np.unique(np.asarray(previous_ids, dtype=np.int64))
    seen = scores[ids]
    scores[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return scores


def apply_presence_frequency_penalties(
    scores: np.ndarray, generated_ids: Sequence[int], presence: float, frequency: float
) -> np.ndarray:
    """OpenAI's rule: subtract ``presence * (count > 0) + frequency * count`` from each generated token's logit.

    Counts are over the generated tokens only (not the prompt), as OpenAI and vLLM count them.
    Negative values encourage repetition. Modifies ``scores`` in place.
    """
    if (presence == 0.0 and frequency == 0.0) or len(generated_ids) == 0:
        return scores
    ids, counts = np.unique(np.asarray(generated_ids, dtype=np.int64), return_counts=True)
    scores[ids] -= presence + frequency * counts
    return scores


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model (raw logits), and the ``top`` most likely tokens at its step.

    ``logprob`` is None only for a prompt's first token, which nothing before it predicts.
    """

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


def _top(row_logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    if n <= 0:
        return ()
    n = min(n, row_logprobs.shape[0])
    ids = np.argpartition(-row_logprobs, n - 1)[:n]
    ids = ids[np.argsort(-row_logprobs[ids], kind="stable")]
    return tuple((int(i), float(row_logprobs[i])) for i in ids)


def token_logprob(logits: np.ndarray, token_id: int, top_n: int) -> TokenLogprob:
    """``token_id``'s log-probability under this step's raw logits (V,), with the ``top_n`` best tokens."""
    row = logprobs(logits)  # (V,)
    return TokenLogprob(token_id, float(row[token_id]), _top(row, top_n))


def prompt_token_logprobs(logits: np.ndarray, prompt_ids: Sequence[int], top_n: int) -> list[TokenLogprob]:
    """Each prompt token's log-probability given the ones before it, from the prompt's logits (T, V).

    The first token has no context to be predicted from: its ``logprob`` is None, as OpenAI reports it.
    """
    assert logits.shape[0] == len(prompt_ids), f"{logits.shape[0]} logit rows for {len(prompt_ids)} tokens"
    rows = logprobs(logits[:-1])  # (T - 1, V): row t predicts token t + 1
    out = [TokenLogprob(int(prompt_ids[0]), None)]
    for t, token in enumerate(prompt_ids[1:]):
        out.append(TokenLogprob(int(token), float(rows[t, token]), _top(rows[t], top_n)))
    return out


BIGGEST = float(np.finfo(np.float64).max)


def _finite(scores: np.ndarray, keep_masked: bool = False) -> np.ndarray:
    """``scores`` with every value finite, in the same order: a penalty or a temperature at the far end
    of its range (a repetition penalty of 5e-324 divides a logit into infinity) must not turn the step
    into NaNs. With ``keep_masked``, minus infinity (a masked token) stays."""
    if np.isfinite(scores).all():
        return scores
    low = -np.inf if keep_masked else -BIGGEST
    return np.nan_to_num(scores, nan=-BIGGEST, posinf=BIGGEST, neginf=low)


def top_p_cutoff(sorted_probs: np.ndarray, top_p: float) -> int:
    """How many of the descending ``sorted_probs`` form the smallest set with mass >= ``top_p`` (at least 1)."""
    if top_p >= 1.0:
        return len(sorted_probs)
    cumulative = np.cumsum(sorted_probs)
    return min(int(np.searchsorted(cumulative, top_p, side="left")) + 1, len(sorted_probs))


class TokenSampler:
    """Picks the next token for one sequence, with a generator of its own."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        # default_rng(None) draws fresh OS entropy: unseeded sequences never share a stream.
        self._rng = np.random.default_rng(params.seed)

    def scores(
        self,
        logits: np.ndarray,
        previous_ids: Sequence[int],
        generated_ids: Sequence[int] = (),
        allowed: np.ndarray | None = None,
    ) -> np.ndarray:
        """This step's logits (V,) as the sampler sees them (float64, a copy): ``logit_bias``, the
        penalties, then every token outside ``allowed`` (a boolean (V,) mask: a grammar's, or the end
        of text banned before ``min_tokens``) at minus infinity. ``previous_ids`` are the ids prompted
        and generated so far (the repetition penalty), ``generated_ids`` the generated ones alone (the
        presence and frequency penalties)."""
        p = self.params
        scores = np.array(logits, dtype=np.float64)  # copy: the caller's row stays untouched
        assert scores.ndim == 1, f"expected logits of shape (V,), got {scores.shape}"
        with np.errstate(over="ignore"):  # an extreme penalty overflows; _finite takes it back
            scores = apply_logit_bias(scores, p.logit_bias)
            scores = apply_repetition_penalty(scores, previous_ids, p.repetition_penalty)
            scores = apply_presence_frequency_penalties(
                scores, generated_ids, p.presence_penalty, p.frequency_penalty
            )
        scores = _finite(scores)
        if allowed is not None:
            scores[~allowed] = -np.inf
        assert np.isfinite(np.max(scores)), "logits must leave some token with a finite score"
        return scores

    def distribution(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sampled distribution of ``scores`` (from ``scores``): (token ids, their probabilities),
        after temperature, top-k and top-p, most likely first when filtered. Not for greedy."""
        p = self.params
        with np.errstate(over="ignore"):  # scores near the float limit: +-inf, then exp gives 0 or 1
            scaled = _finite(scores / p.temperature, keep_masked=True)
            candidates = self._candidates(scaled)  # token ids, highest score first when filtering
            probs = softmax(scaled[candidates])  # renormalised within the kept set
        keep = top_p_cutoff(probs, p.top_p)
        return candidates[:keep], probs[:keep]

    def pick(self, scores: np.ndarray) -> int:
        """The next token from processed ``scores``: argmax when greedy, else one draw."""
        if self.params.is_greedy:
            return int(np.argmax(scores))
        candidates, probs = self.distribution(scores)
        return int(candidates[self._draw(probs)])

    def verify(self, scores: np.ndarray, draft: int) -> tuple[int, bool]:
        """Speculative decoding's check of a proposed ``draft`` against processed ``scores``: (the token,
        whether it is the draft). Greedy: the argmax, the draft kept when it is the argmax. Sampled:
        rejection sampling with a point-mass proposal, the draft kept with probability p(draft), else a
        draw from p without it, so the token is distributed exactly as ``pick`` draws it."""
        if self.params.is_greedy:
            best = int(np.argmax(scores))
            return best, best == draft
        candidates, probs = self.distribution(scores)
        p = probs / probs.sum()
        where = np.flatnonzero(candidates == draft)
        kept = float(p[where[0]]) if where.size else 0.0
        if self._rng.random() < kept:
            return draft, True
        residual = p.copy()
        if where.size:
            residual[where[0]] = 0.0
        return int(candidates[self._draw(residual)]), False

    def next_token(
        self,
        logits: np.ndarray,
        previous_ids: Sequence[int],
        generated_ids: Sequence[int] = (),
        allowed: np.ndarray | None = None,
    ) -> int:
        """Next token id from this step's logits (V,) (``scores`` says what each argument does)."""
        return self.pick(self.scores(logits, previous_ids, generated_ids, allowed))

    def _candidates(self, scores: np.ndarray) -> np.ndarray:
        """Token ids still allowed after top-k, sorted by descending score when top-p needs the order."""
        vocab = scores.shape[0]
        k = self.params.top_k
        if 0 < k < vocab:
            ids = np.argpartition(-scores, k - 1)[:k]  # the k best, unordered: O(V)
            return ids[np.argsort(-scores[ids], kind="stable")]
        if self.params.top_p < 1.0:
            return np.argsort(-scores, kind="stable")
        return np.arange(vocab)

    def _draw(self, probs: np.ndarray) -> int:
        """Inverse-CDF draw: exactly one uniform per token, so a seeded stream stays aligned step by step."""
        cumulative = np.cumsum(probs)
        u = self._rng.random() * cumulative[-1]
        index = int(np.searchsorted(cumulative, u, side="right"))
        if index >= len(probs):  # u rounded up to the total: take the last token with any mass
            index = int(np.flatnonzero(probs)[-1])
        return index
