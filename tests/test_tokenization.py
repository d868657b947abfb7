"""Tokenizers: exact round trips, BERT templates and ids, offsets into the original text."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from model_export.data import load_multi30k, load_sst2, resolve_data_dir
from model_export.tokenization import (
    BERT_SPECIAL_TOKENS,
    special_token_ids,
    train_byte_level_bpe,
    train_wordpiece,
    wordpiece_from_vocab,
)

BPE_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
ROUND_TRIP_TEXTS = [
    "Two young, White males are outside near many bushes.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche. ÄÖÜ äöü ß",
    "emoji 🎉🚀 and 中文 text",
    "  leading spaces,   multiple   spaces\nnew lines\n\n\tand a tab ",
    "",
]


@pytest.fixture(scope="module")
def sample_texts() -> list[str]:
    """A small real sample (English + German + SST-2) keeps training well under a second."""
    data_dir = resolve_data_dir()
    pairs = load_multi30k(data_dir, "validation")
    sst = load_sst2(data_dir, "validation")
    return [text for pair in pairs for text in pair] + [sentence for sentence, _ in sst]


@pytest.fixture(scope="module")
def bpe(sample_texts: list[str]) -> Tokenizer:
    return train_byte_level_bpe(sample_texts, vocab_size=1000, special_tokens=BPE_SPECIALS)


@pytest.fixture(scope="module")
def wordpiece(sample_texts: list[str]) -> Tokenizer:
    return train_wordpiece(sample_texts, vocab_size=2000)


# --- byte-level BPE ------------------------------------------------------------------


def test_bpe_special_ids_and_size(bpe: Tokenizer) -> None:
    assert special_token_ids(bpe, BPE_SPECIALS) == {name: i for i, name in enumerate(BPE_SPECIALS)}
    assert bpe.get_vocab_size() == 1000


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_bpe_round_trip(bpe: Tokenizer, text: str) -> None:
    encoding = bpe.encode(text)
    assert bpe.token_to_id("<unk>") not in encoding.ids
    assert bpe.decode(encoding.ids) == text


def test_bpe_offsets_are_character_offsets(bpe: Tokenizer) -> None:
    text = "Zwei Männer über die Straße 🎉 ok"
    encoding = bpe.encode(text)
    # Tokens (trim_offsets=False keeps the leading space) tile the original string.
    assert encoding.offsets[0][0] == 0 and encoding.offsets[-1][1] == len(text)
    for (start, end), token_id in zip(encoding.offsets, encoding.ids, strict=True):
        piece = bpe.decode([token_id])
        if "\ufffd" not in piece:  # whole characters: the offsets select exactly them
            assert text[start:end] == piece
        else:  # a byte of a multi-byte character maps to that whole character
            assert text[start:end] == "🎉"


# --- WordPiece -----------------------------------------------------------------------


def test_wordpiece_special_ids(wordpiece: Tokenizer) -> None:
    assert special_token_ids(wordpiece, BERT_SPECIAL_TOKENS) == {
        "[PAD]": 0,
        "[UNK]": 1,
        "[CLS]": 2,
        "[SEP]": 3,
        "[MASK]": 4,
    }


def test_wordpiece_single_and_pair(wordpiece: Tokenizer) -> None:
    single = wordpiece.encode("A dog runs.")
    assert single.tokens[0] == "[CLS]" and single.tokens[-1] == "[SEP]"
    assert single.tokens[1:-1] == ["a", "dog", "runs", "."]
    assert set(single.type_ids) == {0}

    pair = wordpiece.encode("A dog runs.", "Ein Hund läuft.")
    first_sep = pair.tokens.index("[SEP]")
    assert pair.ids[0] == 2 and pair.ids[first_sep] == 3 and pair.ids[-1] == 3
    assert pair.tokens[-1] == "[SEP]" and first_sep < len(pair.tokens) - 1
    assert pair.type_ids == [0] * (first_sep + 1) + [1] * (len(pair.tokens) - first_sep - 1)


def test_wordpiece_unknown_and_decode(wordpiece: Tokenizer) -> None:
    encoding = wordpiece.encode("a dog ☃")
    assert encoding.tokens == ["[CLS]", "a", "dog", "[UNK]", "[SEP]"]
    assert wordpiece.decode(wordpiece.encode("A Dog runs.").ids) == "a dog runs."


def _strip_accents_lower(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")


def test_wordpiece_offsets_map_to_original(wordpiece: Tokenizer) -> None:
    text = "Zwei MÄNNER im Café, über Straßen in Zürich!"
    encoding = wordpiece.encode(text)
    spans: dict[int, tuple[int, int]] = {}
    for token, word, (start, end) in zip(encoding.tokens, encoding.word_ids, encoding.offsets, strict=True):
        if word is None:  # [CLS] / [SEP]
            assert start == end == 0
            continue
        if token != "[UNK]":
            assert _strip_accents_lower(text[start:end]) == token.removeprefix("##")
        first, _ = spans.get(word, (start, end))
        spans[word] = (first, end)
    words = [text[start:end] for start, end in spans.values()]
    assert words == ["Zwei", "MÄNNER", "im", "Café", ",", "über", "Straßen", "in", "Zürich", "!"]


def test_wordpiece_cased(sample_texts: list[str]) -> None:
    cased = train_wordpiece(sample_texts[:1000], vocab_size=500, lowercase=False)
    tokens = cased.encode("Zwei Männer").tokens
    assert tokens[1] == "Zwei"
    assert "".join(t.removeprefix("##") for t in tokens[2:-1]) == "Männer"


# --- WordPiece from a BERT vocab.txt -------------------------------------------------


@pytest.fixture
def vocab_file(tmp_path: Path) -> Path:
    tokens = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += ["the", "cat", "sat", "##s", "on", "mat", ".", "cafe", "dog"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def test_wordpiece_from_vocab_ids(vocab_file: Path) -> None:
    tokenizer = wordpiece_from_vocab(vocab_file)
    assert special_token_ids(tokenizer, BERT_SPECIAL_TOKENS) == {
        "[PAD]": 0,
        "[UNK]": 3,
        "[CLS]": 4,
        "[SEP]": 5,
        "[MASK]": 6,
    }
    text = "The cats sat on the Café mat!"
    encoding = tokenizer.encode(text)
    assert encoding.tokens == [
        "[CLS]",
        "the",
        "cat",
        "##s",
        "sat",
        "on",
        "the",
        "cafe",
        "mat",
        "[UNK]",
        "[SEP]",
    ]
    assert encoding.ids == [4, 7, 8, 10, 9, 11, 7, 14, 12, 3, 5]
    assert [text[s:e] for s, e in encoding.offsets[1:-1]] == [
        "The",
        "cat",
        "s",
        "sat",
        "on",
        "the",
        "Café",
        "mat",
        "!",
    ]

    pair = tokenizer.encode("the cat", "the dog")
    assert pair.ids == [4, 7, 8, 5, 7, 15, 5]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]


def test_wordpiece_from_vocab_missing_special(tmp_path: Path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        wordpiece_from_vocab(path)


def test_special_token_ids_missing(bpe: Tokenizer) -> None:
    with pytest.raises(ValueError, match="nosuch"):
        special_token_ids(bpe, ["<pad>", "nosuch"])
