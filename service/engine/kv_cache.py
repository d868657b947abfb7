"""The KV cache of a decoder: its layout in the graph, and the per-row cache of a running batch.

A decoder graph takes one ``past_key.{i}`` / ``past_value.{i}`` tensor per layer,
(batch, heads, past, head_dim), and returns them one column wider as
``present_*``: attention over the past is never recomputed. Both decoders use
this module: the GPT engine (left-padded rows that join and leave the batch at
any step, ``KVCache``) and the translator's greedy and beam search
(``CacheLayout.empty`` for the first step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .manifest import KVCacheSpec
from .runtime import ort


@dataclass(frozen=True)
class CacheLayout:
    """A decoder graph's KV-cache names and shapes, from the manifest's ``kv_cache`` section."""

    past_names: list[str]  # past_key.0, past_value.0, past_key.1, ...
    present_names: list[str]  # in the same order
    num_heads: int
    head_dim: int
    dtype: np.dtype[Any]

    @classmethod
    def of(cls, spec: KVCacheSpec) -> CacheLayout:
        return cls(spec.past_names, spec.present_names, spec.num_heads, spec.head_dim, spec.np_dtype)

    def empty(self, rows: int) -> list[np.ndarray]:
        """A zero-length past for a prefill: (rows, H, 0, Dh) per name."""
        return [np.zeros((rows, self.num_heads, 0, self.head_dim), self.dtype) for _ in self.past_names]


def to_host(tensor: Any) -> np.ndarray:
    """A cache tensor as numpy: device OrtValues (CUDA path) are copied to host, arrays pass through."""
    return tensor.numpy() if isinstance(tensor, ort.OrtValue) else tensor


class KVCache:
    """The past keys/values of a batch, right-aligned: row i's real tokens fill its last ``lengths[i]`` columns.

    ``tensors`` are (B, H, W, Dh) per past name, numpy arrays or, on CUDA, device
    OrtValues straight from the previous step. The columns left of a row's real
    tokens are padding: masked, so their content never matters.
    """

    def __init__(self, tensors: list[Any], lengths: np.ndarray, width: int) -> None:
        self.tensors = tensors
        self.lengths = lengths  # (B,) int64: real tokens per row
        self.width = width  # W
        assert int(lengths.max(initial=0)) <= width, f"a row holds more than the cache width {width}"

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def attention_mask(self, new: int) -> np.ndarray:
        """(B, W + new): 0 over each row's left padding, 1 over its past and the ``new`` columns."""
        columns = np.arange(self.width + new)  # (W + new,)
        return (columns[None, :] >= (self.width - self.lengths)[:, None]).astype(np.int64)

    def select(self, rows: Sequence[int]) -> KVCache:
        """Keep ``rows`` (in that order) and trim the left columns that are padding in all of them."""
        index = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[index]
        width = int(lengths.max(initial=0))
        start = self.width - width
        tensors = [np.ascontiguousarray(to_host(t)[index, :, start:, :]) for t in self.tensors]
        return KVCache(tensors, lengths, width)

    def padded(self, width: int) -> list[np.ndarray]:
        """The tensors on the host, padded on the left with zeros to ``width`` columns."""
        host = [to_host(t) for t in self.tensors]
        if width == self.width:
            return host
        pad = ((0, 0), (0, 0), (width - self.width, 0), (0, 0))
        return [np.pad(t, pad) for t in host]

    @staticmethod
    def merge(first: KVCache, second: KVCache) -> KVCache:
        """Rows of ``first`` then ``second``, both padded on the left to the wider of the two."""
        width = max(first.width, second.width)
        tensors = [
            np.concatenate([a, b], axis=0)  # (B1 + B2, H, W, Dh)
            for a, b in zip(first.padded(width), second.padded(width), strict=True)
        ]
        return KVCache(tensors, np.concatenate([first.lengths, second.lengths]), width)


def positions_from_mask(mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids (B, new) of the last ``new`` columns: real tokens count from 0, padding is skipped."""
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, -new:].astype(np.int64)
