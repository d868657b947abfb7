"""The graph signatures that more than one export shares, named once.

BERT's three token inputs (the four heads' graphs and their attention-map graph), and the
KV-cached decoders' token inputs, cache tensor names and manifest cache layout (the translator
decoder and GPT).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def bert_feed(rng: np.random.Generator, vocab: int, batch: int, length: int) -> dict[str, np.ndarray]:
    """Random BERT inputs (batch, length) for export and parity checks: row 0 padded, two segments."""
    mask = np.ones((batch, length), dtype=np.int64)
    mask[0, length - 2 :] = 0  # a padded row
    types = np.zeros((batch, length), dtype=np.int64)
    types[:, length // 2 :] = 1
    return {
        "input_ids": rng.integers(5, vocab, (batch, length)),
        "attention_mask": mask,
        "token_type_ids": types,
    }


def kv_cache_layout(num_layers: int, num_heads: int, head_dim: int) -> dict[str, Any]:
    """The manifest's ``kv_cache`` entry: the cache tensors' shape and their input / output names."""
    return {
        "num_layers": num_layers,
        "num_heads": num_heads,
        "head_dim": head_dim,
        "dtype": "float32",
        "axes": ["batch", "num_heads", "past_sequence", "head_dim"],
        "past_key": "past_key.{i}",
        "past_value": "past_value.{i}",
        "present_key": "present_key.{i}",
        "present_value": "present_value.{i}",
    }


# The token inputs of every KV-cached decoder graph, in call order: the new tokens, a mask over the
# cached past and the new tokens, and the new tokens' positions.
DECODER_TOKEN_AXES: dict[str, list[str | int]] = {
    "input_ids": ["batch", "sequence"],
    "attention_mask": ["batch", "total_sequence"],
    "position_ids": ["batch", "sequence"],
}


def past_names(num_layers: int, prefix: str) -> list[str]:
    return [f"{prefix}_{kind}.{i}" for i in range(num_layers) for kind in ("key", "value")]
