"""Inputs for the benchmarks: the validation splits of the data folder, or a few built-in lines without it."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from benchmarks.options import ROOT


def data_dir() -> Path | None:
    candidates = [os.environ.get("DATA_DIR"), ROOT.parent / "shared" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


_FALLBACK_TEXTS = [
    "a gorgeous, witty, seductive movie.",
    "the plot is nothing but boilerplate clichés from start to finish.",
    "it's a charming and often affecting journey.",
    "unflinchingly bleak and desperate",
    "a dull, simple-minded and stereotypical tale of drugs, death and mind-numbing indifference.",
    "the acting, costumes, music, cinematography and sound are all astounding given the budget.",
    "it's slow -- very, very slow.",
    "a sometimes tedious film.",
]


def sentiment_texts() -> list[str]:
    """SST-2 validation sentences (real lengths), or a small built-in list without the data folder."""
    root = data_dir()
    path = root / "sst2" / "validation.tsv" if root else None
    if path is None or not path.is_file():
        return list(_FALLBACK_TEXTS)
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.rsplit("\t", 1)[0].strip() for line in lines if line.strip()]


def english_sentences() -> list[str]:
    root = data_dir()
    path = root / "multi30k" / "validation.en.gz" if root else None
    if path is None or not path.is_file():
        return ["A man is riding a bicycle.", "Two dogs play in the snow.", "A woman reads a book."]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def shakespeare_prompts(n: int, chars: int = 48) -> list[str]:
    """``n`` prompts cut from Tiny Shakespeare's validation text at line starts."""
    root = data_dir()
    path = root / "tinyshakespeare" / "validation.txt" if root else None
    text = path.read_text(encoding="utf-8") if path is not None and path.is_file() else ""
    starts = [i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1 : i + 2].isalpha()]
    prompts = [text[s : s + chars].rsplit(" ", 1)[0] or text[s : s + chars] for s in starts]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        prompts = ["ROMEO:\n", "KING:\nWhat say you", "First Citizen:\nBefore we proceed"]
    step = max(1, len(prompts) // n)
    return [prompts[(i * step) % len(prompts)] for i in range(n)]
