"""N-gram speculative decoding (prompt lookup): guess the next tokens from the text so far, check them all
in one step.

Text that repeats itself (code, a quoted document, a summary that copies its source, a list that
continues a pattern) often continues the way it went on after the last time its latest few tokens
appeared. ``propose`` finds the latest earlier occurrence of the sequence's last n tokens (n from
``max_n`` down to ``min_n``) in its prompt and generated tokens that is followed by ``tokens`` tokens (else
the latest), and proposes the tokens that followed it (TGI's and vLLM's ``ngram`` speculation). The running batch then feeds each row
its pending token and its proposal in one model call (``DecoderGraph.verify``), which gives the logits
after every one of them, and accepts the longest run of proposed tokens that decoding would have picked:

- greedy: a proposed token is kept while it is the argmax, so the output is exactly the output without
  speculation, and the first mismatch is replaced by the argmax (one more token for free);
- sampled: rejection sampling (Leviathan et al.; the proposal is a point mass q on token d): d is kept
  with probability p(d), else a token is drawn from p with d taken out. Each token is then distributed
  exactly as plain sampling would draw it, seeded runs reproducibly so.

Constrained sequences (structured output) are not speculated for; they share verification steps with a
one-token "proposal" of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Speculation", "propose"]


@dataclass(frozen=True)
class Speculation:
    """How many tokens to propose at most, the n-gram sizes matched (longest first), and the most
    sequences the running batch may hold for a step to speculate (a wider check costs a large batch more
    than its proposals save: vLLM's ``disable_by_batch_size``)."""

    tokens: int
    max_n: int = 3
    min_n: int = 2
    max_rows: int = 4

    def __post_init__(self) -> None:
        assert self.tokens >= 1 and 1 <= self.min_n <= self.max_n, f"bad speculation settings {self}"
        assert self.max_rows >= 1, f"bad speculation settings {self}"


def propose(ids: list[int], spec: Speculation, limit: int) -> list[int]:
    """Up to ``min(spec.tokens, limit)`` tokens that followed the latest earlier occurrence of the last n
    of ``ids`` (the longest n that occurs), or none."""
    count = min(spec.tokens, limit)
    if count <= 0:
        return []
    array = np.asarray(ids, dtype=np.int64)
    for n in range(min(spec.max_n, len(ids) - 1), spec.min_n - 1, -1):
        tail = array[-n:]
        # windows[i] = ids[i : i + n], for every start whose window ends before the tail's last token
        windows = np.lib.stride_tricks.sliding_window_view(array[:-1], n)
        starts = np.flatnonzero((windows == tail).all(axis=1))
        if starts.size:
            # the latest occurrence that is followed by ``count`` tokens (in a run that repeats itself, the
            # very latest overlaps the tail and is followed by one), else the latest
            whole = starts[starts + n + count <= len(ids)]
            follow = int(whole[-1] if whole.size else starts[-1]) + n
            return [int(t) for t in array[follow : follow + count]]
    return []
