"""Evaluation scores, each matching the standard tool for its task so that reported numbers
are comparable with published ones: sacreBLEU's BLEU and chrF for translation, the official
SQuAD v1.1 script's exact match and F1 for QA, conlleval's entity F1 for NER, and bits per
character for language models.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable

from model_export.data import SquadExample

__all__ = [
    "bits_per_char",
    "corpus_bleu",
    "corpus_chrf",
    "entity_f1",
    "entity_spans",
    "exact_match",
    "f1",
    "normalize_answer",
    "squad_scores",
]


# --- Translation ---------------------------------------------------------------------


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (0-100) of detokenized text with sacreBLEU's default 13a tokenizer.

    One reference per hypothesis, as in Multi30k.
    """
    # Imported here: sacrebleu is an export-only dependency and this module is also
    # importable where only the SQuAD / NER metrics are needed.
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def corpus_chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF (0-100, sacreBLEU's defaults: character 6-grams, beta 2).

    Character n-grams give partial credit that BLEU's word 4-grams do not, so
    at low scores chrF tells a poor translation (the right words, badly put:
    chrF 40+) from fluent text unrelated to the source (chrF near 20).
    """
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    return float(sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score)


# --- SQuAD v1.1 (port of the official evaluate-v1.1.py) -------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lowercase, drop punctuation, drop articles a/an/the, collapse whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _token_f1(prediction: str, truth: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def _check_truths(truths: list[str]) -> None:
    if not truths:
        raise ValueError("at least one reference answer is needed")


def exact_match(prediction: str, truths: list[str]) -> float:
    """1.0 if the normalized prediction equals any normalized reference, else 0.0."""
    _check_truths(truths)
    target = normalize_answer(prediction)
    return float(any(target == normalize_answer(t) for t in truths))


def f1(prediction: str, truths: list[str]) -> float:
    """Best token-level F1 (0-1) of the prediction against any reference."""
    _check_truths(truths)
    return max(_token_f1(prediction, t) for t in truths)


def squad_scores(predictions: dict[str, str], examples: list[SquadExample]) -> dict[str, float]:
    """``{"exact_match", "f1"}`` in 0-100, averaged over ``examples``.

    A question without a prediction scores as the empty answer, so partial prediction
    sets cannot inflate the score.
    """
    if not examples:
        raise ValueError("no examples to score")
    em_total = f1_total = 0.0
    for example in examples:
        truths = [text for _, text in example.answers]
        prediction = predictions.get(example.id, "")
        em_total += exact_match(prediction, truths)
        f1_total += f1(prediction, truths)
    n = len(examples)
    return {"exact_match": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


# --- NER (conlleval-style entity F1) --------------------------------------------------


def entity_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    """Entities ``(type, start, end_exclusive)`` in IOB2 ``tags``.

    As in conlleval, an ``I-X`` that does not continue an ``X`` entity starts a new
    one, so ill-formed model output is still scored rather than rejected.
    """
    spans: list[tuple[str, int, int]] = []
    current: str | None = None
    start = 0
    for i, tag in enumerate(tags):
        if tag == "O":
            prefix, kind = "O", None
        else:
            prefix, sep, kind = tag.partition("-")
            if not sep or prefix not in ("B", "I") or not kind:
                raise ValueError(f"invalid IOB2 tag {tag!r} at position {i}")
        continues = prefix == "I" and kind == current
        if current is not None and not continues:
            spans.append((current, start, i))
            current = None
        if kind is not None and not continues:
            current, start = kind, i
    if current is not None:
        spans.append((current, start, len(tags)))
    return spans


def _span_set(sequences: Iterable[list[str]]) -> set[tuple[int, str, int, int]]:
    return {(n, *span) for n, tags in enumerate(sequences) for span in entity_spans(tags)}


def entity_f1(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Micro precision / recall / F1 (0-1) over exact (type, start, end) entity matches."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sequences but {len(predicted)} predicted")
    for n, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sequence {n}: {len(g)} gold tags but {len(p)} predicted")
    gold_spans, pred_spans = _span_set(gold), _span_set(predicted)
    correct = len(gold_spans & pred_spans)
    precision = correct / len(pred_spans) if pred_spans else 0.0
    recall = correct / len(gold_spans) if gold_spans else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f}


# --- Language modelling ---------------------------------------------------------------


def bits_per_char(total_nll_nats: float, num_chars: int) -> float:
    """Convert a summed negative log-likelihood in nats to bits per character."""
    if num_chars <= 0:
        raise ValueError("num_chars must be positive")
    return total_nll_nats / (num_chars * math.log(2))
