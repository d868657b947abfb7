"""Loaders against the real files in shared/data (counts from its README) and tiny fakes."""

from __future__ import annotations

import gzip
import json
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from model_export import data
from model_export.data import (
    CONLL_LABELS,
    DataError,
    iob1_to_iob2,
    load_conll,
    load_fashion_mnist,
    load_multi30k,
    load_squad,
    load_sst2,
    load_tinyshakespeare,
    resolve_data_dir,
)

SPLITS = ["train", "validation"]


@pytest.fixture(scope="module")
def data_dir() -> Path:
    return resolve_data_dir()


# --- real data -----------------------------------------------------------------------


@pytest.mark.parametrize(("split", "count"), [("train", 29_000), ("validation", 1_014)])
def test_multi30k_counts(data_dir: Path, split: str, count: int) -> None:
    pairs = load_multi30k(data_dir, split)
    assert len(pairs) == count
    assert all(en and de for en, de in pairs)
    if split == "train":
        assert pairs[0] == (
            "Two young, White males are outside near many bushes.",
            "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        )


@pytest.mark.parametrize(
    ("split", "negative", "positive"), [("train", 25_296, 31_695), ("validation", 414, 458)]
)
def test_sst2_counts(data_dir: Path, split: str, negative: int, positive: int) -> None:
    rows = load_sst2(data_dir, split)
    assert Counter(label for _, label in rows) == {0: negative, 1: positive}
    assert all(not sentence.endswith(" ") and "\t" not in sentence for sentence, _ in rows)
    if split == "train":
        assert rows[0] == ("contains no wit , only labored gags", 0)


@pytest.mark.parametrize(("split", "count", "articles"), [("train", 6_407, 30), ("validation", 1_386, 6)])
def test_squad_counts_and_spans(data_dir: Path, split: str, count: int, articles: int) -> None:
    examples = load_squad(data_dir, split)
    assert len(examples) == count
    assert len({e.title for e in examples}) == articles
    assert len({e.id for e in examples}) == count
    for e in examples:
        assert e.answers
        for start, text in e.answers:
            assert e.context[start : start + len(text)] == text


def test_squad_first_example(data_dir: Path) -> None:
    first = load_squad(data_dir, "train")[0]
    assert first.id == "56be4db0acb8001400a502ec"
    assert first.question == "Which NFL team represented the AFC at Super Bowl 50?"
    assert first.answers[0] == (177, "Denver Broncos")


@pytest.mark.parametrize(
    ("split", "sentences", "tokens"), [("train", 14_041, 203_621), ("validation", 3_250, 51_362)]
)
def test_conll_counts(data_dir: Path, split: str, sentences: int, tokens: int) -> None:
    corpus = load_conll(data_dir, split)
    assert len(corpus) == sentences
    assert sum(len(s.tokens) for s in corpus) == tokens
    for s in corpus:
        assert len(s.tokens) == len(s.tags)
        assert set(s.tags) <= set(CONLL_LABELS)
        assert "-DOCSTART-" not in s.tokens
        # IOB2: an I-X always continues an X entity.
        for prev, tag in zip(["O", *s.tags], s.tags, strict=False):
            if tag.startswith("I-"):
                assert prev[2:] == tag[2:]
    if split == "train":
        assert corpus[0].tokens[:3] == ["EU", "rejects", "German"]
        assert corpus[0].tags[:3] == ["B-ORG", "O", "B-MISC"]


@pytest.mark.parametrize(("split", "count"), [("train", 55_000), ("validation", 5_000)])
def test_fashion_mnist_shapes(data_dir: Path, split: str, count: int) -> None:
    images, labels = load_fashion_mnist(data_dir, split)
    assert images.shape == (count, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (count,) and labels.dtype == np.int64
    assert labels.min() == 0 and labels.max() == 9
    if split == "train":
        assert labels[:2].tolist() == [9, 0]
    else:
        assert np.bincount(labels).min() >= 450 and np.bincount(labels).max() <= 527


@pytest.mark.parametrize(("split", "chars"), [("train", 892_315), ("validation", 111_539)])
def test_tinyshakespeare_length(data_dir: Path, split: str, chars: int) -> None:
    text = load_tinyshakespeare(data_dir, split)
    assert len(text) == chars
    if split == "train":
        assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")


# --- IOB1 -> IOB2 --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("iob1", "iob2"),
    [
        (["I-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]),  # I- at sentence start
        (["O", "I-ORG", "I-ORG"], ["O", "B-ORG", "I-ORG"]),
        (["I-LOC", "B-LOC", "I-LOC"], ["B-LOC", "B-LOC", "I-LOC"]),  # B- between same-type entities
        (["I-PER", "I-ORG", "I-ORG"], ["B-PER", "B-ORG", "I-ORG"]),  # type change
        (["O", "O"], ["O", "O"]),
        ([], []),
    ],
)
def test_iob1_to_iob2(iob1: list[str], iob2: list[str]) -> None:
    assert iob1_to_iob2(iob1) == iob2


# --- a "test" split in a tmp dir laid out like shared/data ----------------------------


def _idx(magic: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    return struct.pack(f">{1 + len(shape)}I", magic, *shape) + payload


@pytest.fixture
def fake_data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for folder in ["multi30k", "sst2", "squad", "conll2003", "fashion_mnist", "tinyshakespeare"]:
        (root / folder).mkdir(parents=True)
    with gzip.open(root / "multi30k/test.en.gz", "wt", encoding="utf-8") as f:
        f.write("A dog runs.\nTwo men.\n")
    with gzip.open(root / "multi30k/test.de.gz", "wt", encoding="utf-8") as f:
        f.write("Ein Hund läuft.\nZwei Männer.\n")
    (root / "sst2/test.tsv").write_text("sentence\tlabel\na café \t1\nbad\t , really \t0\n", encoding="utf-8")
    squad = {
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": "Zürich is big.",
                        "qas": [
                            {
                                "id": "q1",
                                "question": "What?",
                                "answers": [
                                    {"answer_start": 0, "text": "Zürich"},
                                    {"answer_start": 10, "text": "big"},
                                ],
                            }
                        ],
                    }
                ],
            }
        ],
        "version": "1.1",
    }
    (root / "squad/test.json").write_text(json.dumps(squad), encoding="utf-8")
    (root / "conll2003/test.txt").write_text(
        "-DOCSTART- -X- O O\n\nPeter NNP I-NP I-PER\nBlom NNP I-NP I-PER\n\nParis NNP I-NP I-LOC\n",
        encoding="utf-8",
    )
    images = np.arange(2 * 28 * 28, dtype=np.uint32).astype(np.uint8).tobytes()
    (root / "fashion_mnist/test-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(_idx(0x803, (2, 28, 28), images))
    )
    (root / "fashion_mnist/test-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(_idx(0x801, (2,), bytes([3, 7])))
    )
    (root / "tinyshakespeare/test.txt").write_text("ROMEO:\nHi ō\n", encoding="utf-8")
    return root


def test_test_split_in_tmp_dir(fake_data_dir: Path) -> None:
    assert load_multi30k(fake_data_dir, "test") == [
        ("A dog runs.", "Ein Hund läuft."),
        ("Two men.", "Zwei Männer."),
    ]
    assert load_sst2(fake_data_dir, "test") == [("a café", 1), ("bad\t , really", 0)]
    (example,) = load_squad(fake_data_dir, "test")
    assert example.answers == [(0, "Zürich"), (10, "big")] and example.title == "T"
    conll = load_conll(fake_data_dir, "test")
    assert [s.tags for s in conll] == [["B-PER", "I-PER"], ["B-LOC"]]
    images, labels = load_fashion_mnist(fake_data_dir, "test")
    assert images.shape == (2, 28, 28) and images[0, 0, 5] == 5
    assert labels.tolist() == [3, 7]
    assert load_tinyshakespeare(fake_data_dir, "test") == "ROMEO:\nHi ō\n"


def test_multi30k_line_mismatch(fake_data_dir: Path) -> None:
    with gzip.open(fake_data_dir / "multi30k/test.de.gz", "wt", encoding="utf-8") as f:
        f.write("Nur eine Zeile.\n")
    with pytest.raises(ValueError, match="lines"):
        load_multi30k(fake_data_dir, "test")


def test_fashion_mnist_bad_magic(fake_data_dir: Path) -> None:
    (fake_data_dir / "fashion_mnist/test-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(_idx(0x803, (2,), b"\0\0"))
    )
    with pytest.raises(ValueError, match="magic"):
        load_fashion_mnist(fake_data_dir, "test")


def test_fashion_mnist_count_mismatch(fake_data_dir: Path) -> None:
    (fake_data_dir / "fashion_mnist/test-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(_idx(0x801, (3,), b"\0\0"))
    )
    with pytest.raises(ValueError):
        load_fashion_mnist(fake_data_dir, "test")


@pytest.mark.parametrize(
    ("loader", "missing"),
    [
        (load_multi30k, "multi30k/nosuch.en.gz"),
        (load_sst2, "sst2/nosuch.tsv"),
        (load_squad, "squad/nosuch.json"),
        (load_conll, "conll2003/nosuch.txt"),
        (load_fashion_mnist, "fashion_mnist/nosuch-images-idx3-ubyte.gz"),
        (load_tinyshakespeare, "tinyshakespeare/nosuch.txt"),
    ],
)
def test_missing_file_raises_data_error(fake_data_dir: Path, loader, missing: str) -> None:
    with pytest.raises(DataError) as excinfo:
        loader(fake_data_dir, "nosuch")
    assert isinstance(excinfo.value, FileNotFoundError)
    assert str((fake_data_dir / missing).resolve()) in str(excinfo.value)
    assert "nosuch" in str(excinfo.value)


# --- resolve_data_dir ----------------------------------------------------------------


def test_resolve_explicit_value_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_DIR", "/does/not/exist")
    assert resolve_data_dir(tmp_path) == tmp_path
    assert resolve_data_dir(str(tmp_path)) == tmp_path


def test_resolve_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path


def test_resolve_missing_explicit(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope"):
        resolve_data_dir(tmp_path / "nope")


def test_resolve_default_relative_to_cwd_then_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATA_DIR", raising=False)
    (tmp_path / "shared/data").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_data_dir() == (tmp_path / "shared/data").resolve()
    # Nothing next to the cwd: fall back to the project root, else fail with advice.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data, "_PROJECT_ROOT", tmp_path / "work")
    assert resolve_data_dir() == (tmp_path / "shared/data").resolve()
    monkeypatch.setattr(data, "_PROJECT_ROOT", tmp_path)
    with pytest.raises(DataError, match="DATA_DIR"):
        resolve_data_dir()
