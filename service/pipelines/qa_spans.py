"""Extractive QA: (question, context) -> sliding windows -> best span with character offsets.

Contexts longer than the model's window are cut into overlapping windows
(`stride` tokens of overlap, as BERT QA does); each window is
[CLS] question [SEP] context-chunk [SEP]. The answer is the best-scoring span
start <= end < start + max_answer_len (at most max_answer_len tokens) over all windows, mapped back to
character offsets in the original context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer


@dataclass
class QAWindow:
    input_ids: list[int]
    token_type_ids: list[int]
    context_offsets: list[tuple[int, int] | None]  # per token: (start, end) in the context, None outside it

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Span:
    start: int  # character offsets into the context
    end: int
    score: float
    window: int


def qa_windows(
    tokenizer: Tokenizer, question: str, context: str, max_len: int, stride: int, max_question_len: int
) -> list[QAWindow]:
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    assert cls_id is not None and sep_id is not None, "a QA tokenizer needs [CLS] and [SEP]"
    q_ids = tokenizer.encode(question, add_special_tokens=False).ids[:max_question_len]
    c = tokenizer.encode(context, add_special_tokens=False)
    room = max_len - len(q_ids) - 3
    assert room > stride, (
        f"window of {max_len} leaves {room} context tokens, not more than the stride {stride}"
    )
    windows = []
    start = 0
    while True:
        chunk = slice(start, start + room)
        ids = [cls_id, *q_ids, sep_id, *c.ids[chunk], sep_id]
        n_ctx = len(c.ids[chunk])
        windows.append(
            QAWindow(
                input_ids=ids,
                token_type_ids=[0] * (len(q_ids) + 2) + [1] * (n_ctx + 1),
                context_offsets=[None] * (len(q_ids) + 2) + list(c.offsets[chunk]) + [None],
            )
        )
        if start + room >= len(c.ids):
            return windows
        start += room - stride


def answer_token_span(window: QAWindow, answer_start: int, answer_end: int) -> tuple[int, int] | None:
    """Token indices (start, end inclusive) covering the answer's characters, or None if the window misses it."""
    start_tok = end_tok = None
    for i, span in enumerate(window.context_offsets):
        if span is None:
            continue
        if start_tok is None and span[1] > answer_start:
            start_tok = i
        if span[0] < answer_end:
            end_tok = i
    if start_tok is None or end_tok is None or end_tok < start_tok:
        return None
    first = next(s for s in window.context_offsets if s is not None)
    last = next(s for s in reversed(window.context_offsets) if s is not None)
    if answer_start < first[0] or answer_end > last[1]:
        return None
    return start_tok, end_tok


def best_span(
    windows: list[QAWindow],
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    max_answer_len: int,
    context_probabilities: bool = False,
) -> Span | None:
    """The highest start+end score over context tokens with start <= end < start + max_answer_len.

    The score reported is p(start) * p(end) under each window's softmax, so
    it reads as a confidence between 0 and 1. Windows compete by their best start + end logit; with
    ``context_probabilities`` (transformers' question-answering pipeline, the manifest's
    ``qa.span_score``), each window's softmax covers its context tokens and [CLS] alone and windows
    compete by that p(start) * p(end).
    """
    best: Span | None = None
    best_logit = -np.inf
    for w, (window, s, e) in enumerate(zip(windows, start_logits, end_logits, strict=True)):
        n = len(window)
        s, e = s[:n].astype(np.float64), e[:n].astype(np.float64)
        in_context = np.array([o is not None for o in window.context_offsets])
        if not in_context.any():
            continue
        pairs = s[:, None] + e[None, :]  # (n, n): start i, end j
        i, j = np.indices((n, n))
        allowed = (j >= i) & (j - i < max_answer_len) & in_context[:, None] & in_context[None, :]
        pairs = np.where(allowed, pairs, -np.inf)
        flat = int(pairs.argmax())
        bi, bj = divmod(flat, n)
        # transformers' pipeline normalises over the context tokens and [CLS] (the window's first token)
        normalised = in_context | (np.arange(n) == 0) if context_probabilities else np.ones(n, dtype=bool)
        p_start = np.exp(s[bi] - np.logaddexp.reduce(s[normalised]))
        p_end = np.exp(e[bj] - np.logaddexp.reduce(e[normalised]))
        candidate = float(p_start * p_end) if context_probabilities else float(pairs[bi, bj])
        if candidate > best_logit:
            best_logit = candidate
            start_off, end_off = window.context_offsets[bi], window.context_offsets[bj]
            assert start_off is not None and end_off is not None
            best = Span(start_off[0], end_off[1], float(p_start * p_end), w)
    return best
