"""Generation parameters and token selection: repetition penalty, greedy, temperature, top-k, top-p (numpy).

One ``TokenSampler`` per sequence, each with its own random generator, so a seeded
sequence draws the same tokens whichever other sequences share its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SamplingParams", "TokenSampler", "logprobs", "softmax"]


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is generated (vLLM's ``SamplingParams``): how many tokens, where to stop, how to pick.

    ``temperature == 0`` (or ``greedy=True``) means argmax. ``top_k == 0`` and
    ``top_p == 1`` switch those filters off; ``repetition_penalty == 1`` switches the
    penalty off. ``seed`` makes sampling reproducible. ``max_new_tokens`` is also
    bounded by the model's context (the engine ends the sequence there, finish
    ``length``); the text is cut before the first of the ``stop`` strings.
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    greedy: bool = False

    def __post_init__(self) -> None:
        assert self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}"
        assert self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"
        assert self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"
        assert 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"
        assert self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"

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

    def next_token(self, logits: np.ndarray, previous_ids: Sequence[int]) -> int:
        """Next token id from this step's logits (V,) and the ids generated (and prompted) so far."""
        p = self.params
        scores = np.array(logits, dtype=np.float64)  # copy: the caller's row stays untouched
        assert scores.ndim == 1, f"expected logits of shape (V,), got {scores.shape}"
        assert np.isfinite(np.max(scores)), "logits must contain a finite maximum"
        scores = apply_repetition_penalty(scores, previous_ids, p.repetition_penalty)
        if p.is_greedy:
            return int(np.argmax(scores))
        scores /= p.temperature
        candidates = self._candidates(scores)  # token ids, highest score first when filtering
        probs = softmax(scores[candidates])  # renormalised within the kept set
        keep = top_p_cutoff(probs, p.top_p)
        return int(candidates[self._draw(probs[:keep])])

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
