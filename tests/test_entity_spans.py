"""Entities from token logits, in isolation: first-sub-token word tags, word spans, BIO grouping, mean scores.

Logits are built by hand so that each token's softmax is known exactly; the one
tokenizer is the service's own WordPiece pipeline over a vocabulary written here,
so which words split into sub-tokens is fixed by the test, not by a trained model.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from model_export.tokenization import BERT_SPECIAL_TOKENS, wordpiece_from_vocab
from service.pipelines.entity_spans import Entity, group_entities, word_char_spans, word_predictions

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def token_logits(rows: list[tuple[str, float]]) -> np.ndarray:
    """(T, len(LABELS)) logits whose softmax gives each token's label exactly the given probability."""
    logits = np.empty((len(rows), len(LABELS)), dtype=np.float32)
    for t, (label, p) in enumerate(rows):
        logits[t] = np.log((1 - p) / (len(LABELS) - 1))
        logits[t, LABELS.index(label)] = np.log(p)
    return logits


def summary(entities: list[Entity]) -> list[tuple[str, int, int, int, int]]:
    return [(e.label, e.start, e.end, e.first_word, e.last_word) for e in entities]


# --- word_predictions: each word is tagged by its first sub-token ---------------------------------


def test_word_takes_the_tag_and_probability_of_its_first_sub_token() -> None:
    word_ids = [None, 0, 0, 0, 1, 1, None]  # [CLS] w0 w0 w0 w1 w1 [SEP]
    logits = token_logits(
        [
            ("B-LOC", 0.99),
            ("B-PER", 0.7),
            ("O", 0.95),
            ("O", 0.95),
            ("I-PER", 0.6),
            ("B-LOC", 0.9),
            ("O", 0.99),
        ]
    )
    tags, scores = word_predictions(logits, word_ids, LABELS)
    assert tags == ["B-PER", "I-PER"]  # not the special tokens' B-LOC, not the later sub-tokens' O / B-LOC
    assert scores == pytest.approx([0.7, 0.6], abs=1e-6)


def test_word_score_is_the_softmax_probability_of_the_chosen_tag() -> None:
    logits = np.array([[1.0, 3.0, 0.0, 0.0, -1.0]], dtype=np.float32)
    tags, scores = word_predictions(logits, [0], LABELS)
    expected = np.exp(3.0) / np.exp([1.0, 3.0, 0.0, 0.0, -1.0]).sum()
    assert tags == ["B-PER"]
    assert scores == pytest.approx([expected], rel=1e-9)


def test_only_special_tokens_give_no_words() -> None:
    assert word_predictions(token_logits([("B-PER", 0.9), ("O", 0.9)]), [None, None], LABELS) == ([], [])


# --- word_char_spans: a word's characters are its sub-tokens' union -----------------------------------


def test_word_span_covers_all_its_sub_tokens() -> None:
    # "Ada Lovelace": [CLS] ada love ##lace [SEP]
    spans = word_char_spans([None, 0, 1, 1, None], [(0, 0), (0, 3), (4, 8), (8, 12), (0, 0)])
    assert spans == [(0, 3), (4, 12)]


def test_no_words_give_no_spans() -> None:
    assert word_char_spans([None, None], [(0, 0), (0, 0)]) == []


# --- group_entities: BIO tags to entities -----------------------------------------------------------------

SPANS = [(0, 3), (4, 12), (13, 18), (19, 21), (22, 28), (29, 35), (36, 40)]  # seven words, one space apart


def test_b_then_i_of_the_same_label_is_one_entity() -> None:
    entities = group_entities(["B-PER", "I-PER", "I-PER", "O"], [0.9, 0.6, 0.3, 1.0], SPANS[:4])
    assert summary(entities) == [("PER", 0, 18, 0, 2)]
    assert entities[0].score == pytest.approx(0.6)  # the mean of 0.9, 0.6, 0.3; O words do not count


def test_i_without_a_preceding_b_starts_an_entity() -> None:
    """conlleval's reading, as the docstring says: an I-X that continues nothing opens an X entity."""
    entities = group_entities(["I-PER", "I-PER", "O", "I-LOC"], [0.8, 0.4, 1.0, 0.7], SPANS[:4])
    assert summary(entities) == [("PER", 0, 12, 0, 1), ("LOC", 19, 21, 3, 3)]
    assert [e.score for e in entities] == pytest.approx([0.6, 0.7])


def test_a_label_change_ends_the_entity() -> None:
    entities = group_entities(["B-PER", "I-PER", "I-LOC", "I-LOC"], [0.9, 0.7, 0.5, 0.3], SPANS[:4])
    assert summary(entities) == [("PER", 0, 12, 0, 1), ("LOC", 13, 21, 2, 3)]
    assert [e.score for e in entities] == pytest.approx([0.8, 0.4])


def test_o_ends_the_entity_and_a_later_i_starts_another() -> None:
    entities = group_entities(["B-LOC", "O", "I-LOC"], [0.5, 1.0, 0.9], SPANS[:3])
    assert summary(entities) == [("LOC", 0, 3, 0, 0), ("LOC", 13, 18, 2, 2)]


def test_b_after_b_of_the_same_label_starts_a_new_entity() -> None:
    entities = group_entities(["B-PER", "B-PER", "I-PER"], [0.9, 0.5, 0.7], SPANS[:3])
    assert summary(entities) == [("PER", 0, 3, 0, 0), ("PER", 4, 18, 1, 2)]
    assert [e.score for e in entities] == pytest.approx([0.9, 0.6])


def test_an_entity_running_to_the_last_word_is_kept() -> None:
    entities = group_entities(["O"] * 5 + ["B-LOC", "I-LOC"], [1.0] * 5 + [0.2, 0.4], SPANS)
    assert summary(entities) == [("LOC", 29, 40, 5, 6)]
    assert entities[0].score == pytest.approx(0.3)


def test_all_o_gives_no_entities() -> None:
    assert group_entities(["O", "O"], [0.9, 0.9], SPANS[:2]) == []
    assert group_entities([], [], []) == []


# --- the three together on a real WordPiece tokenizer --------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The service's BERT pipeline (lowercasing, punctuation split) over a vocabulary that splits 'Lovelace'."""
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    words = ["ada", "love", "##lace", "lived", "in", "london", "."]
    vocab.write_text("\n".join([*BERT_SPECIAL_TOKENS, *words]) + "\n")
    return wordpiece_from_vocab(vocab)


def test_sub_tokens_map_to_words_by_their_first_sub_token(tokenizer: Tokenizer) -> None:
    text = "Ada Lovelace lived in London."
    encoding = tokenizer.encode(text)
    assert encoding.tokens == ["[CLS]", "ada", "love", "##lace", "lived", "in", "london", ".", "[SEP]"]
    # '##lace' says B-LOC with high confidence; only 'love', the first sub-token of 'Lovelace', counts.
    logits = token_logits(
        [("O", 0.9), ("B-PER", 0.8), ("I-PER", 0.6), ("B-LOC", 0.99), ("O", 0.9), ("O", 0.9), ("B-LOC", 0.7),
         ("O", 0.9), ("O", 0.9)]
    )  # fmt: skip
    tags, scores = word_predictions(logits, encoding.word_ids, LABELS)
    spans = word_char_spans(encoding.word_ids, encoding.offsets)
    assert [text[s:e] for s, e in spans] == ["Ada", "Lovelace", "lived", "in", "London", "."]
    assert tags == ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]

    entities = group_entities(tags, scores, spans)
    assert [(e.label, text[e.start : e.end]) for e in entities] == [
        ("PER", "Ada Lovelace"),
        ("LOC", "London"),
    ]
    assert [e.score for e in entities] == pytest.approx([0.7, 0.7], abs=1e-6)
