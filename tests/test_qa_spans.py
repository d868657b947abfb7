"""Extractive QA post-processing in isolation: windows, answer token spans and the best-span search.

`best_span` gets hand-built windows and logits, so each test controls exactly
which pairs compete; `qa_windows` and `answer_token_span` run on the service's
own WordPiece pipeline over a vocabulary written here (one token per word).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tokenizers import Tokenizer

from model_export.tokenization import BERT_SPECIAL_TOKENS, wordpiece_from_vocab
from service.pipelines.qa_spans import QAWindow, answer_token_span, best_span, qa_windows

CONTEXT = "Ada lived in London with her mother."
WORDS = [(0, 3), (4, 9), (10, 12), (13, 19), (20, 24), (25, 28), (29, 35), (35, 36)]  # offsets into CONTEXT
QUESTION_TOKENS = 3  # [CLS] q q q [SEP] before the context in every hand-built window
FIRST = QUESTION_TOKENS + 2  # index of the first context token


def window(offsets: list[tuple[int, int]]) -> QAWindow:
    """[CLS] question [SEP] context [SEP], with the given context token offsets."""
    n_ctx = len(offsets)
    return QAWindow(
        input_ids=list(range(QUESTION_TOKENS + n_ctx + 3)),
        token_type_ids=[0] * (QUESTION_TOKENS + 2) + [1] * (n_ctx + 1),
        context_offsets=[None] * (QUESTION_TOKENS + 2) + list(offsets) + [None],
    )


def logits(w: QAWindow, peaks: dict[int, float], width: int | None = None) -> np.ndarray:
    """Zeros over the window (and `width - len(w)` padding columns), with the given values at token indices."""
    row = np.zeros(width or len(w), dtype=np.float32)
    for index, value in peaks.items():
        row[index] = value
    return row


def probability(row: np.ndarray, index: int) -> float:
    z = np.exp(row.astype(np.float64))
    return float(z[index] / z.sum())


def answer(span_start: int, span_end: int) -> str:
    return CONTEXT[span_start:span_end]


# --- best_span: the search -----------------------------------------------------------------------------


def test_single_token_answer_and_its_character_offsets() -> None:
    w = window(WORDS)
    london = FIRST + 3
    s, e = logits(w, {london: 6.0}), logits(w, {london: 5.0})
    span = best_span([w], [s], [e], max_answer_len=5)
    assert span is not None
    assert (span.start, span.end, span.window) == (13, 19, 0)
    assert answer(span.start, span.end) == "London"
    assert span.score == pytest.approx(probability(s, london) * probability(e, london), rel=1e-6)


def test_multi_token_answer_runs_from_the_start_token_start_to_the_end_token_end() -> None:
    w = window(WORDS)
    s, e = logits(w, {FIRST + 2: 4.0}), logits(w, {FIRST + 3: 4.0})
    span = best_span([w], [s], [e], max_answer_len=5)
    assert span is not None and answer(span.start, span.end) == "in London"


def test_the_best_pair_is_found_in_a_later_window_with_offsets_into_the_whole_context() -> None:
    first, second = window(WORDS[:5]), window(WORDS[3:])  # overlap: 'London', 'with'
    mother = FIRST + 3  # WORDS[6] in the second window
    starts = [logits(first, {FIRST + 1: 3.0}), logits(second, {mother: 4.0})]
    ends = [logits(first, {FIRST + 1: 3.0}), logits(second, {mother: 4.0})]
    span = best_span([first, second], starts, ends, max_answer_len=5)
    assert span is not None
    assert (span.window, span.start, span.end) == (1, 29, 35)
    assert answer(span.start, span.end) == "mother"


def test_tokens_outside_the_context_are_never_chosen() -> None:
    w = window(WORDS)
    sep = len(w) - 1
    huge = {0: 50.0, 1: 50.0, FIRST - 1: 50.0, sep: 50.0}  # [CLS], a question token, both [SEP]s
    s = logits(w, {**huge, FIRST + 4: 2.0})
    e = logits(w, {**huge, FIRST + 5: 2.0})
    span = best_span([w], [s], [e], max_answer_len=5)
    assert span is not None and answer(span.start, span.end) == "with her"


def test_padding_beyond_the_window_is_ignored() -> None:
    """Rows come from a padded batch: columns past len(window) are neither candidates nor in the softmax."""
    w = window(WORDS[:3])
    s = logits(w, {FIRST: 1.0, len(w) + 1: 80.0}, width=len(w) + 4)
    e = logits(w, {FIRST: 1.0, len(w) + 2: 80.0}, width=len(w) + 4)
    span = best_span([w], [s], [e], max_answer_len=5)
    assert span is not None and answer(span.start, span.end) == "Ada"
    assert span.score == pytest.approx(probability(s[: len(w)], FIRST) ** 2, rel=1e-6)


def test_end_before_start_is_never_chosen() -> None:
    w = window(WORDS)
    # The inverted pair (start 'her', end 'in') would score 20; the best ordered pair is ('lived', 'in'): 15.
    s = logits(w, {FIRST + 5: 10.0, FIRST + 1: 5.0})
    e = logits(w, {FIRST + 2: 10.0, FIRST + 6: 3.0})
    span = best_span([w], [s], [e], max_answer_len=8)
    assert span is not None and answer(span.start, span.end) == "lived in"


def test_spans_longer_than_max_answer_len_tokens_are_never_chosen() -> None:
    w = window(WORDS)
    s = logits(w, {FIRST: 10.0})
    e = logits(w, {FIRST + 3: 10.0, FIRST + 2: 0.5})
    # 'Ada lived in London' is 4 tokens: allowed at max_answer_len=4 (end - start < 4), not at 3,
    # where the best that fits is 'Ada lived in' (10 + 0.5).
    at_four = best_span([w], [s], [e], max_answer_len=4)
    assert at_four is not None and answer(at_four.start, at_four.end) == "Ada lived in London"
    at_three = best_span([w], [s], [e], max_answer_len=3)
    assert at_three is not None and answer(at_three.start, at_three.end) == "Ada lived in"


def test_ties_go_to_the_earliest_start_then_the_earliest_end_then_the_first_window() -> None:
    w = window(WORDS)
    flat = logits(w, {})
    span = best_span([w], [flat], [flat], max_answer_len=3)  # every allowed pair scores 0
    assert span is not None and (span.start, span.end) == (0, 3)

    s = logits(w, {FIRST + 2: 5.0, FIRST + 4: 5.0})
    e = logits(w, {FIRST + 3: 5.0, FIRST + 5: 5.0})  # ('in', 'London') and ('with', 'her') both score 10
    span = best_span([w], [s], [e], max_answer_len=2)
    assert span is not None and answer(span.start, span.end) == "in London"

    same = window(WORDS)
    span = best_span([w, same], [s, s], [e, e], max_answer_len=2)
    assert span is not None and span.window == 0


def test_windows_compete_on_the_logit_sum_and_the_score_is_the_winner_s_own_softmax() -> None:
    """The rule as written: the highest start + end logit wins across windows; the reported score is
    p(start) * p(end) under that window's softmax, so a window with a lower logit sum but a sharper
    softmax (a higher reported score) loses."""
    flat_high, sharp_low = window(WORDS[:4]), window(WORDS[4:])
    starts = [
        logits(flat_high, {i: 5.0 for i in range(len(flat_high))}),  # sum 10, p = 1/10 each
        logits(sharp_low, {FIRST: 4.0}),  # sum 8, p close to 1
    ]
    ends = [starts[0].copy(), logits(sharp_low, {FIRST: 4.0})]
    span = best_span([flat_high, sharp_low], starts, ends, max_answer_len=3)
    assert span is not None and span.window == 0
    assert span.score == pytest.approx((1 / len(flat_high)) ** 2, rel=1e-6)
    assert span.score < probability(starts[1], FIRST) * probability(ends[1], FIRST)


def test_no_context_token_anywhere_gives_none() -> None:
    empty = window([])
    assert best_span([empty], [logits(empty, {1: 9.0})], [logits(empty, {1: 9.0})], max_answer_len=5) is None
    assert best_span([], [], [], max_answer_len=5) is None


def test_a_window_without_context_is_skipped_not_fatal() -> None:
    empty, w = window([]), window(WORDS[:2])
    span = best_span([empty, w], [logits(empty, {}), logits(w, {})], [logits(empty, {}), logits(w, {})], 5)
    assert span is not None and span.window == 1 and answer(span.start, span.end) == "Ada"


def test_windows_and_logits_must_pair_up() -> None:
    w = window(WORDS)
    with pytest.raises(ValueError):
        best_span([w, w], [logits(w, {})], [logits(w, {})], max_answer_len=5)


# --- qa_windows and answer_token_span on a real tokenizer --------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    words = ["where", "does", "ada", "live", "?", "she", "lived", "in", "london", "with", "her", "mother",
             "and", "cat", ".", "paris"]  # fmt: skip
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join([*BERT_SPECIAL_TOKENS, *words]) + "\n")
    return wordpiece_from_vocab(vocab)


QUESTION = "Where does Ada live?"


def test_one_window_is_cls_question_sep_context_sep(tokenizer: Tokenizer) -> None:
    (w,) = qa_windows(tokenizer, QUESTION, CONTEXT, max_len=32, stride=4, max_question_len=16)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    question = tokenizer.encode(QUESTION, add_special_tokens=False).ids
    context = tokenizer.encode(CONTEXT, add_special_tokens=False).ids
    assert w.input_ids == [cls, *question, sep, *context, sep]
    assert w.token_type_ids == [0] * (len(question) + 2) + [1] * (len(context) + 1)
    in_context = [o for o in w.context_offsets if o is not None]
    assert w.context_offsets[: len(question) + 2] == [None] * (len(question) + 2)
    assert w.context_offsets[-1] is None
    assert [CONTEXT[s:e] for s, e in in_context] == [
        "Ada",
        "lived",
        "in",
        "London",
        "with",
        "her",
        "mother",
        ".",
    ]


def test_long_context_windows_overlap_by_the_stride_and_cover_every_token(tokenizer: Tokenizer) -> None:
    context = " ".join(["she lived in London with her mother and cat."] * 6)  # 60 context tokens
    n_tokens = len(tokenizer.encode(context, add_special_tokens=False).ids)
    max_len, stride = 24, 5
    windows = qa_windows(tokenizer, QUESTION, context, max_len=max_len, stride=stride, max_question_len=16)
    assert len(windows) > 2
    chunks = [[o for o in w.context_offsets if o is not None] for w in windows]
    assert all(len(w) <= max_len for w in windows)
    assert all(len(w) == max_len for w in windows[:-1])  # every window but the last is full
    for before, after in itertools.pairwise(chunks):
        assert before[-stride:] == after[:stride]
    covered = {o for chunk in chunks for o in chunk}
    assert len(covered) == n_tokens
    assert chunks[0][0][0] == 0 and chunks[-1][-1][1] == len(context)


def test_question_is_cut_to_max_question_len(tokenizer: Tokenizer) -> None:
    (w,) = qa_windows(tokenizer, QUESTION, CONTEXT, max_len=32, stride=4, max_question_len=2)
    assert w.token_type_ids.count(0) == 2 + 2
    assert w.input_ids[1:3] == tokenizer.encode(QUESTION, add_special_tokens=False).ids[:2]


def test_a_window_with_no_room_beyond_the_stride_is_refused(tokenizer: Tokenizer) -> None:
    question_tokens = len(tokenizer.encode(QUESTION, add_special_tokens=False).ids)
    with pytest.raises(AssertionError, match="not more than the stride"):
        qa_windows(
            tokenizer, QUESTION, CONTEXT, max_len=question_tokens + 3 + 4, stride=4, max_question_len=16
        )


def test_an_empty_context_gives_one_window_and_no_answer(tokenizer: Tokenizer) -> None:
    (w,) = qa_windows(tokenizer, QUESTION, "   ", max_len=32, stride=4, max_question_len=16)
    assert all(o is None for o in w.context_offsets)
    row = np.arange(len(w), dtype=np.float32)
    assert best_span([w], [row], [row], max_answer_len=5) is None


def test_answer_token_span_covers_the_answer_characters(tokenizer: Tokenizer) -> None:
    (w,) = qa_windows(tokenizer, QUESTION, CONTEXT, max_len=32, stride=4, max_question_len=16)
    first = w.token_type_ids.index(1)
    assert answer_token_span(w, 13, 19) == (first + 3, first + 3)  # 'London'
    assert answer_token_span(w, 4, 19) == (first + 1, first + 3)  # 'lived in London'
    assert answer_token_span(w, 15, 17) == (first + 3, first + 3)  # characters inside one token


def test_answer_token_span_is_none_when_the_window_misses_the_answer(tokenizer: Tokenizer) -> None:
    context = " ".join(["she lived in London with her mother and cat."] * 6) + " paris"
    windows = qa_windows(tokenizer, QUESTION, context, max_len=24, stride=5, max_question_len=16)
    paris = (len(context) - 5, len(context))
    assert [answer_token_span(w, *paris) is not None for w in windows] == [False] * (len(windows) - 1) + [
        True
    ]
    first_end = max(o[1] for o in windows[0].context_offsets if o is not None)
    straddling = (first_end - 3, first_end + 4)  # starts in the first window, ends past it
    assert answer_token_span(windows[0], *straddling) is None


def test_labelled_tokens_decode_back_to_the_answer_in_the_last_window(tokenizer: Tokenizer) -> None:
    """Training labels (answer_token_span) and inference (best_span) agree on offsets in a later window."""
    context = " ".join(["she lived in London with her mother and cat."] * 6) + " paris"
    windows = qa_windows(tokenizer, QUESTION, context, max_len=24, stride=5, max_question_len=16)
    target = (len(context) - 5, len(context))
    last = len(windows) - 1
    token = answer_token_span(windows[last], *target)
    assert token is not None
    starts = [logits(w, {}) for w in windows]
    ends = [logits(w, {}) for w in windows]
    starts[last][token[0]] = ends[last][token[1]] = 7.0
    span = best_span(windows, starts, ends, max_answer_len=4)
    assert span is not None
    assert (span.window, span.start, span.end) == (last, *target)
    assert context[span.start : span.end] == "paris"
