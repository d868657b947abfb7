"""Loaders for the six datasets in ``shared/data`` (format documented in its README.md).

Every loader takes ``(data_dir, split)`` and reads only files named after the split
(``S.*``), so a held-out ``test`` split laid out the same way works unchanged.
The loaders return plain Python / numpy objects so that training code, evaluation
scripts and tests share one definition of each format (no torch here).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "CONLL_LABELS",
    "FASHION_MNIST_CLASSES",
    "SST2_LABELS",
    "DataError",
    "SquadExample",
    "TaggedSentence",
    "iob1_to_iob2",
    "load_conll",
    "load_fashion_mnist",
    "load_multi30k",
    "load_squad",
    "load_sst2",
    "load_tinyshakespeare",
    "resolve_data_dir",
]

SST2_LABELS = ["negative", "positive"]
CONLL_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]

_DEFAULT_DATA_DIR = Path("..") / "shared" / "data"
_PROJECT_ROOT = Path(__file__).resolve().parent.parent
_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801


class DataError(FileNotFoundError):
    """A dataset file or directory is missing.

    Subclasses FileNotFoundError so generic handlers still work, but the message always
    names the full path (and dataset/split) so a wrong ``--data-dir`` is obvious.
    """


def resolve_data_dir(value: str | os.PathLike[str] | None = None) -> Path:
    """Find the data directory: explicit ``value`` (``--data-dir``), else ``$DATA_DIR``,
    else ``../shared/data`` relative to the current directory, then to the project root.

    Raises DataError if the chosen directory does not exist, so misconfiguration fails
    before any training starts rather than deep inside a loader.
    """
    if value is not None or os.environ.get("DATA_DIR"):
        source = "--data-dir" if value is not None else "DATA_DIR"
        path = Path(value if value is not None else os.environ["DATA_DIR"]).expanduser()
        if not path.is_dir():
            raise DataError(f"data directory {path.resolve()} (from {source}) does not exist")
        return path
    candidates = [Path.cwd() / _DEFAULT_DATA_DIR, _PROJECT_ROOT / _DEFAULT_DATA_DIR]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    tried = ", ".join(str(c.resolve()) for c in candidates)
    raise DataError(f"no data directory found (tried {tried}); pass --data-dir or set DATA_DIR")


def _require(path: Path, dataset: str, split: str) -> Path:
    """Return ``path`` or raise DataError naming it, the dataset and the split."""
    if not path.is_file():
        raise DataError(f"{dataset} split {split!r}: missing file {path.resolve()}")
    return path


def _split_file(data_dir: str | os.PathLike[str], dataset: str, split: str, name: str) -> Path:
    return _require(Path(data_dir) / dataset / name, dataset, split)


def _read_gz_lines(path: Path) -> list[str]:
    """Lines of a gzipped UTF-8 text file, without their line ends."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


# --- Multi30k ------------------------------------------------------------------------


def load_multi30k(data_dir: str | os.PathLike[str], split: str) -> list[tuple[str, str]]:
    """(english, german) sentence pairs; line i of ``S.en.gz`` translates to line i of ``S.de.gz``."""
    en_path = _split_file(data_dir, "multi30k", split, f"{split}.en.gz")
    de_path = _split_file(data_dir, "multi30k", split, f"{split}.de.gz")
    english, german = _read_gz_lines(en_path), _read_gz_lines(de_path)
    if len(english) != len(german):
        raise ValueError(
            f"multi30k split {split!r}: {en_path} has {len(english)} lines but {de_path} has {len(german)}"
        )
    return list(zip(english, german, strict=True))


# --- SST-2 ---------------------------------------------------------------------------


def load_sst2(data_dir: str | os.PathLike[str], split: str) -> list[tuple[str, int]]:
    """(sentence, label) rows from ``sst2/S.tsv``.

    The TSV has no quoting, so each line is split on its last tab; GLUE's trailing
    space before the tab is removed so tokenizers see the plain sentence.
    """
    path = _split_file(data_dir, "sst2", split, f"{split}.tsv")
    rows: list[tuple[str, int]] = []
    with path.open(encoding="utf-8") as f:
        header = f.readline().rstrip("\n")
        if header != "sentence\tlabel":
            raise ValueError(f"{path}: unexpected header {header!r}")
        for line_no, line in enumerate(f, start=2):
            line = line.rstrip("\n")
            if not line:
                continue
            sentence, sep, label = line.rpartition("\t")
            if not sep or label not in ("0", "1"):
                raise ValueError(f"{path}:{line_no}: expected 'sentence<TAB>0|1', got {line!r}")
            rows.append((sentence.removesuffix(" "), int(label)))
    return rows


# --- SQuAD ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SquadExample:
    """One SQuAD v1.1 question; ``answers`` keeps every reference (start, text) in file
    order because evaluation takes the max over all of them and training uses the first."""

    id: str
    title: str
    context: str
    question: str
    answers: list[tuple[int, str]]


def load_squad(data_dir: str | os.PathLike[str], split: str) -> list[SquadExample]:
    """All questions of ``squad/S.json`` (official v1.1 layout), in file order."""
    path = _split_file(data_dir, "squad", split, f"{split}.json")
    with path.open(encoding="utf-8") as f:
        payload = json.load(f)
    examples: list[SquadExample] = []
    for article in payload["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = [(int(a["answer_start"]), a["text"]) for a in qa["answers"]]
                examples.append(SquadExample(qa["id"], article["title"], context, qa["question"], answers))
    return examples


# --- CoNLL-2003 ----------------------------------------------------------------------


@dataclass(frozen=True)
class TaggedSentence:
    """A sentence with one NER tag per token, in IOB2 (BIO)."""

    tokens: list[str]
    tags: list[str]


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """Rewrite IOB1 tags as IOB2: ``I-X`` becomes ``B-X`` when it starts an entity,
    i.e. at sentence start or after ``O`` or a tag of another type.

    IOB2 makes every entity start with ``B-``, which is what token classifiers learn.
    """
    out: list[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            out.append("B-" + tag[2:])
        else:
            out.append(tag)
        prev = tag
    return out


def load_conll(data_dir: str | os.PathLike[str], split: str) -> list[TaggedSentence]:
    """Sentences of ``conll2003/S.txt`` with NER tags (4th column) converted to IOB2."""
    path = _split_file(data_dir, "conll2003", split, f"{split}.txt")
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []

    def flush() -> None:
        if tokens:
            sentences.append(TaggedSentence(list(tokens), iob1_to_iob2(tags)))
            tokens.clear()
            tags.clear()

    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                flush()
                continue
            if fields[0] == "-DOCSTART-":
                continue
            if len(fields) != 4:
                raise ValueError(f"{path}:{line_no}: expected 4 columns, got {line.rstrip()!r}")
            tokens.append(fields[0])
            tags.append(fields[3])
    flush()
    return sentences


# --- Fashion-MNIST -------------------------------------------------------------------


def _read_idx(path: Path, magic: int, dims: int) -> tuple[list[int], bytes]:
    """Parse a gzipped big-endian IDX file: check ``magic``, return (shape, payload)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    header_len = 4 * (1 + dims)
    if len(raw) < header_len:
        raise ValueError(f"{path}: truncated IDX header")
    header = np.frombuffer(raw[:header_len], dtype=">u4")
    if int(header[0]) != magic:
        raise ValueError(f"{path}: magic {int(header[0]):#010x}, expected {magic:#010x}")
    shape = [int(d) for d in header[1:]]
    payload = raw[header_len:]
    if len(payload) != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but payload has {len(payload)} bytes")
    return shape, payload


def load_fashion_mnist(data_dir: str | os.PathLike[str], split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, 28, 28) and labels int64 (N,) from the split's gzipped IDX files."""
    images_path = _split_file(data_dir, "fashion_mnist", split, f"{split}-images-idx3-ubyte.gz")
    labels_path = _split_file(data_dir, "fashion_mnist", split, f"{split}-labels-idx1-ubyte.gz")
    image_shape, image_bytes = _read_idx(images_path, _IDX_IMAGES_MAGIC, dims=3)
    label_shape, label_bytes = _read_idx(labels_path, _IDX_LABELS_MAGIC, dims=1)
    if image_shape[0] != label_shape[0]:
        raise ValueError(
            f"fashion_mnist split {split!r}: {image_shape[0]} images but {label_shape[0]} labels"
        )
    if image_shape[1:] != [28, 28]:
        raise ValueError(f"{images_path}: images are {image_shape[1:]}, expected 28x28")
    # Copy so callers get writable arrays (frombuffer over bytes is read-only).
    images = np.frombuffer(image_bytes, dtype=np.uint8).reshape(image_shape).copy()
    labels = np.frombuffer(label_bytes, dtype=np.uint8).astype(np.int64)
    if labels.size and labels.max() >= len(FASHION_MNIST_CLASSES):
        raise ValueError(f"{labels_path}: label {int(labels.max())} out of range")
    return images, labels


# --- Tiny Shakespeare ----------------------------------------------------------------


def load_tinyshakespeare(data_dir: str | os.PathLike[str], split: str) -> str:
    """The whole split as one string (character-level LM data)."""
    path = _split_file(data_dir, "tinyshakespeare", split, f"{split}.txt")
    return path.read_text(encoding="utf-8")
