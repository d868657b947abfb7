"""Batches of token ids for encoder models: right padding and the attention mask."""

from __future__ import annotations

import numpy as np


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
