"""Metrics on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from model_export.data import SquadExample
from model_export.scoring import (
    bits_per_char,
    corpus_bleu,
    corpus_chrf,
    entity_f1,
    entity_spans,
    exact_match,
    f1,
    normalize_answer,
    squad_scores,
)

# --- BLEU ----------------------------------------------------------------------------


def test_bleu_identical_is_100() -> None:
    refs = ["Zwei junge weiße Männer sind im Freien.", "Ein Hund läuft über die Wiese."]
    assert corpus_bleu(refs, refs) == pytest.approx(100.0)


def test_bleu_disjoint_is_near_zero() -> None:
    hyps = ["alpha beta gamma delta epsilon"]
    refs = ["Zwei junge Männer sind draußen."]
    assert corpus_bleu(hyps, refs) < 1.0


def test_bleu_partial_between() -> None:
    score = corpus_bleu(["Ein Hund läuft über die Straße."], ["Ein Hund läuft über die Wiese."])
    assert 0.0 < score < 100.0


def test_bleu_length_mismatch() -> None:
    with pytest.raises(ValueError):
        corpus_bleu(["a"], ["a", "b"])


# --- chrF ----------------------------------------------------------------------------


def test_chrf_separates_poor_from_unrelated() -> None:
    """The reason it is reported: a translation with the right words badly put scores far above
    fluent German that has nothing to do with the source, while BLEU calls both near zero."""
    refs = ["Ein kleiner Hund rennt über eine grüne Wiese.", "Zwei Männer spielen Fußball im Park."]
    poor = ["Hund klein rennt Wiese grün über.", "Männer zwei Fußball Park spielen."]
    unrelated = ["Eine Frau sitzt auf einer Bank.", "Ein Mädchen liest ein Buch am Strand."]
    assert corpus_chrf(refs, refs) == pytest.approx(100.0)
    assert corpus_bleu(poor, refs) < 15 and corpus_bleu(unrelated, refs) < 15
    assert corpus_chrf(poor, refs) > corpus_chrf(unrelated, refs) + 20
    with pytest.raises(ValueError):
        corpus_chrf(["a"], ["a", "b"])


# --- SQuAD ---------------------------------------------------------------------------


def test_normalize_answer() -> None:
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("theater") == "theater"  # articles only as whole words


def test_exact_match() -> None:
    assert exact_match("the Denver Broncos.", ["Denver Broncos"]) == 1.0
    assert exact_match("Broncos", ["Denver Broncos"]) == 0.0
    assert exact_match("Broncos", ["Denver Broncos", "broncos"]) == 1.0  # max over references


def test_f1_token_overlap() -> None:
    # prediction tokens {denver, broncos, team}, truth {denver, broncos}: P=2/3, R=1 -> F1=0.8
    assert f1("the Denver Broncos team", ["Denver Broncos"]) == pytest.approx(0.8)
    # max over references: second reference matches exactly
    assert f1("Broncos", ["Denver Broncos", "Broncos"]) == pytest.approx(1.0)
    # P=1/1, R=1/2 -> 2/3
    assert f1("Broncos", ["Denver Broncos"]) == pytest.approx(2 / 3)
    assert f1("Panthers", ["Denver Broncos"]) == 0.0
    assert f1("", ["Denver Broncos"]) == 0.0


def test_f1_counts_repeated_tokens() -> None:
    # overlap uses min counts: "new new york" vs "new york" share 2 tokens, P=2/3, R=1 -> 0.8
    assert f1("new new york", ["new york"]) == pytest.approx(0.8)


def _example(qid: str, *answers: str) -> SquadExample:
    context = " ".join(answers)
    return SquadExample(qid, "T", context, "?", [(context.index(a), a) for a in answers])


def test_squad_scores_average_and_missing() -> None:
    examples = [
        _example("q1", "Denver Broncos", "Broncos"),
        _example("q2", "Santa Clara"),
        _example("q3", "Levi's Stadium"),  # no prediction: scored as ""
    ]
    predictions = {"q1": "the Broncos", "q2": "Clara California"}
    scores = squad_scores(predictions, examples)
    assert scores["exact_match"] == pytest.approx(100 / 3)
    # q1: 1.0, q2: P=1/2 R=1/2 -> 0.5, q3: 0
    assert scores["f1"] == pytest.approx(100 * 1.5 / 3)


# --- NER -----------------------------------------------------------------------------


def test_entity_spans() -> None:
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "I-ORG", "I-ORG", "B-MISC"]
    assert entity_spans(tags) == [("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 6), ("ORG", 6, 8), ("MISC", 8, 9)]
    assert entity_spans(["I-PER", "I-PER"]) == [("PER", 0, 2)]  # conlleval: I- starts an entity
    assert entity_spans(["B-PER", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 2)]
    assert entity_spans(["O", "O"]) == []
    assert entity_spans([]) == []


def test_entity_spans_rejects_bad_tag() -> None:
    with pytest.raises(ValueError):
        entity_spans(["X-PER"])


def test_entity_f1_known_values() -> None:
    gold = [
        ["B-PER", "I-PER", "O", "B-LOC"],  # PER(0,2), LOC(3,4)
        ["B-ORG", "O", "B-MISC", "I-MISC"],  # ORG(0,1), MISC(2,4)
    ]
    predicted = [
        ["B-PER", "I-PER", "O", "B-ORG"],  # PER correct, ORG(3,4) wrong type
        ["B-ORG", "O", "B-MISC", "O"],  # ORG correct, MISC(2,3) wrong boundary
    ]
    scores = entity_f1(gold, predicted)
    # 2 correct of 4 predicted, 2 of 4 gold
    assert scores == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5})

    scores = entity_f1([["B-PER", "O", "B-LOC"]], [["B-PER", "O", "O"]])
    assert scores == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3})


def test_entity_f1_spans_are_per_sentence() -> None:
    # The same span in a different sentence is not a match.
    scores = entity_f1([["B-PER"], ["O"]], [["O"], ["B-PER"]])
    assert scores == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_entity_f1_no_entities() -> None:
    assert entity_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_entity_f1_length_mismatch() -> None:
    with pytest.raises(ValueError):
        entity_f1([["O", "O"]], [["O"]])


# --- bits per char -------------------------------------------------------------------


def test_bits_per_char() -> None:
    assert bits_per_char(100 * math.log(2), 100) == pytest.approx(1.0)
    assert bits_per_char(0.0, 5) == 0.0
    with pytest.raises(ValueError):
        bits_per_char(1.0, 0)
