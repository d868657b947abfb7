"""Text inputs of the pipelines: batch tokenization, truncation to the window, right-padded batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.engine.runtime import Graph
from service.observe import spans

P = ParamSpec("P")
T = TypeVar("T")

# Below this many characters (or bytes), preparing a request inline costs less than handing it to a
# thread and back (measured: ~0.1 ms of event-loop CPU per request saved at ~300 requests/s).
INLINE_LIMIT = 2048


async def preprocess(size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args)``, the tokenizing (its ``tokenize`` span, with traces on): inline for small inputs, in a
    worker thread for large ones (the loop stays free)."""
    with spans.span("tokenize", {"inference.input.chars": size}):
        if size <= INLINE_LIMIT:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)


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


def pad_batch(
    rows: list[list[int]], pad_id: int, type_rows: list[list[int]] | None = None
) -> dict[str, np.ndarray]:
    """input_ids, attention_mask and token_type_ids (B, longest), right-padded."""
    length = max(map(len, rows))
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    types = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
        if type_rows is not None:
            types[i, : len(row)] = type_rows[i]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def truncate(ids: list[int], max_len: int) -> list[int]:
    """Cut to max_len, keeping the final [SEP] (or </s>)."""
    return ids if len(ids) <= max_len else [*ids[: max_len - 1], ids[-1]]
