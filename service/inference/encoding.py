"""Tokenization helpers shared by the text pipelines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.engine.runtime import Graph


@dataclass(frozen=True)
class EncodedText:
    ids: list[int]  # what the model sees (special tokens included, cut to its window)
    truncated: bool  # the text had more tokens than the window


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Encoding]:
    """Batch encoding: the Rust tokenizer spreads a batch over its own threads."""
    return list(tokenizer.encode_batch(list(texts)))


def feeds_for(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Only the inputs this graph declares (e.g. a BERT export may omit token_type_ids)."""
    return {name: feeds[name] for name in graph.input_names}
