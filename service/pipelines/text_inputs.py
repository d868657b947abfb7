"""Text inputs of the pipelines: batch tokenization, truncation to the window, right-padded batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, ParamSpec, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.engine.runtime import Graph
from service.errors import InvalidInputError
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


@dataclass(frozen=True)
class Truncation:
    """What becomes of a text longer than the model's window: cut on the right (the default: the text's
    end is lost) or on the left (its start is lost), its first and last special tokens kept either way; or,
    with ``cut`` false (TEI's ``truncate: false``), refused, naming the text."""

    cut: bool = True
    side: Literal["right", "left"] = "right"

    def kept(self, length: int, max_len: int, index: int) -> list[int] | None:
        """The positions of a ``length``-token encoding that fit ``max_len`` (None: all of them)."""
        if length <= max_len:
            return None
        if not self.cut:
            raise InvalidInputError(
                f"{length} tokens; the model's window is {max_len} tokens, and truncate is false "
                "(send a shorter text, or truncate: true to cut it)",
                "inputs",
                "too_many_tokens",
                index,
            )
        if self.side == "left":  # the first token ([CLS]), then the text's last tokens with the final [SEP]
            return [0, *range(length - (max_len - 1), length)]
        return [*range(max_len - 1), length - 1]

    @property
    def key(self) -> dict[str, object]:
        """What the response cache must tell apart: nothing for the default (its old keys stay valid)."""
        return {} if self == CUT_RIGHT else {"truncate": self.cut, "truncation_direction": self.side}


CUT_RIGHT = Truncation()  # the default on every encoder task: cut at the end, flagged ``truncated``


def truncate(ids: list[int], max_len: int, truncation: Truncation = CUT_RIGHT, index: int = 0) -> list[int]:
    """Cut to max_len, keeping the first token and the final [SEP] (or </s>): ``truncation``'s side."""
    kept = truncation.kept(len(ids), max_len, index)
    return ids if kept is None else [ids[i] for i in kept]
