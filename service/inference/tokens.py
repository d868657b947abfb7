"""Tokenize and detokenize with a served model's own tokenizer (TEI's /tokenize and /decode, vLLM's
/tokenize and /detokenize): the ids the model would see, each with its text and where it is in the input.

Offsets are character positions into the input (as every other answer of this service gives them); a
special token ([CLS], [SEP], <|endoftext|>...) has none, and its text is the token itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from service.errors import InvalidInputError

from .limits import INPUTS

IDS = "ids"  # the core's name for the token ids to decode


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the input's characters start:stop; a special token's own text
    special: bool
    start: int | None  # character offsets into the input (None: a special token)
    stop: int | None


def tokens_of(tokenizer: Tokenizer, texts: Sequence[str], add_special_tokens: bool) -> list[list[Token]]:
    """Each text's tokens, as the model's tokenizer cuts it (no truncation: every token)."""
    rows = []
    for text, e in zip(
        texts, tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens), strict=True
    ):
        row = []
        for i, (start, stop) in enumerate(e.offsets):
            special = bool(e.special_tokens_mask[i])
            if special:
                row.append(Token(e.ids[i], e.tokens[i], True, None, None))
            else:
                row.append(Token(e.ids[i], text[start:stop], False, start, stop))
        rows.append(row)
    return rows


def decoded(tokenizer: Tokenizer, rows: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
    """Each row of ids as text; an id outside the vocabulary is an error naming it (``ids`` and its row)."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    for index, row in enumerate(rows):
        for token in row:
            if not 0 <= token < size:
                raise InvalidInputError(
                    f"token id {token} is not in the model's vocabulary (0..{size - 1})",
                    IDS,
                    "unknown_token",
                    index,
                )
    return [tokenizer.decode(list(row), skip_special_tokens=skip_special_tokens) for row in rows]


__all__ = ["IDS", "INPUTS", "Token", "decoded", "tokens_of"]
