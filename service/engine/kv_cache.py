"""The KV cache of a decoder: its layout in the graph, and the per-row cache of a running batch.

A decoder graph takes one ``past_key.{i}`` / ``past_value.{i}`` tensor per layer,
(batch, heads, past, head_dim), and returns them one column wider as
``present_*``: attention over the past is never recomputed. Both decoders use
this module: the GPT engine (left-padded rows that join and leave the batch at
any step, ``KVCache``) and the translator's greedy and beam search
(``CacheLayout.empty`` for the first step).

Two ways for the cache to grow by a column. ``KVCache``: the exported graphs' own,
``Concat(past, new)`` into a new ``present`` tensor, so every step copies the whole
past. ``KVBuffer``: one buffer per past name preallocated for the running batch,
(rows, H, max_length, Dh), that the in-place step graph (``model_export/inplace_kv.py``,
GroupQueryAttention) writes each new column into, reading only each row's valid
prefix; a step then costs what its attention costs, whatever the past's size.
Both offer ``keep(rows)`` (rows leave) and ``extend(cache)`` (prefilled rows join)
to the running batch.
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

    def keep(self, rows: Sequence[int]) -> KVCache:
        return self.select(rows)

    def extend(self, joining: KVCache) -> KVCache:
        return KVCache.merge(self, joining)

    @staticmethod
    def merge(first: KVCache, second: KVCache) -> KVCache:
        """Rows of ``first`` then ``second``, both padded on the left to the wider of the two."""
        width = max(first.width, second.width)
        tensors = [
            np.concatenate([a, b], axis=0)  # (B1 + B2, H, W, Dh)
            for a, b in zip(first.padded(width), second.padded(width), strict=True)
        ]
        return KVCache(tensors, np.concatenate([first.lengths, second.lengths]), width)


class KVBuffer:
    """The in-place cache of a running batch: row i's keys/values fill columns ``[0, lengths[i])``.

    One C-contiguous numpy buffer per past name, (capacity, H, max_length, Dh); the live rows are
    the first ``rows``, so the step graph is bound to the buffers' own memory for both ``past`` and
    ``present`` and writes each row's new column at ``lengths[i]``. Rows are left-aligned (a row's
    valid prefix has no padding) and the columns past a row's length are never read. Joining copies a
    prefilled row's real tokens in; leaving moves later rows' prefixes down over the gap; capacity
    doubles when the rows outgrow it. ``max_length`` is the model's context, which a sequence never
    exceeds (``SequenceState.limit``), so a step never writes past the end.
    """

    def __init__(self, layout: CacheLayout, max_length: int, capacity: int = 8) -> None:
        self.layout = layout
        self.max_length = max_length
        self.buffers = [self._allocate(capacity) for _ in layout.past_names]
        self.lengths = np.zeros(0, dtype=np.int64)  # (rows,)

    @classmethod
    def empty(cls, layout: CacheLayout, max_length: int, rows: int) -> KVBuffer:
        """``rows`` rows with an empty past (the translator's first step)."""
        buffer = cls(layout, max_length, capacity=max(rows, 1))
        buffer.lengths = np.zeros(rows, dtype=np.int64)
        return buffer

    def _allocate(self, capacity: int) -> np.ndarray:
        shape = (capacity, self.layout.num_heads, self.max_length, self.layout.head_dim)
        return np.zeros(shape, self.layout.dtype)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[0]

    @property
    def width(self) -> int:
        return int(self.lengths.max(initial=0))

    def extend(self, joining: KVCache) -> KVBuffer:
        """Append ``joining``'s rows (a prefill's right-aligned cache) after the live ones."""
        start, new = self.rows, joining.rows
        assert int(joining.lengths.max(initial=0)) <= self.max_length, "a row longer than the buffer"
        if start + new > self.capacity:
            capacity = max(2 * self.capacity, start + new)
            grown = [self._allocate(capacity) for _ in self.buffers]
            for old, bigger in zip(self.buffers, grown, strict=True):
                bigger[:start, :, : self.width] = old[:start, :, : self.width]
            self.buffers = grown
        for buffer, tensor in zip(self.buffers, joining.padded(joining.width), strict=True):
            for row, length in enumerate(joining.lengths.tolist()):
                buffer[start + row, :, :length] = tensor[row, :, joining.width - length :]
        self.lengths = np.concatenate([self.lengths, joining.lengths])
        return self

    def keep(self, rows: Sequence[int]) -> KVBuffer:
        """Keep ``rows`` (ascending), moved down to be the first ``len(rows)``: a copy of each moved prefix."""
        assert list(rows) == sorted(rows), "rows keep their order"
        for target, source in enumerate(rows):
            if target != source:
                length = int(self.lengths[source])
                for buffer in self.buffers:  # target < source: never overwrites a row still to move
                    buffer[target, :, :length] = buffer[source, :, :length]
        self.lengths = self.lengths[np.asarray(rows, dtype=np.int64)]
        return self

    def reorder(self, rows: Sequence[int] | np.ndarray) -> KVBuffer:
        """Row i becomes a copy of row ``rows[i]`` (beam search: survivors, repeated): copies every prefix."""
        index = np.asarray(rows, dtype=np.int64)
        width = int(self.lengths[index].max(initial=0))
        for buffer in self.buffers:
            buffer[: len(index), :, :width] = buffer[index, :, :width]  # the right side is gathered first
        self.lengths = self.lengths[index]
        return self


def positions_from_mask(mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids (B, new) of the last ``new`` columns: real tokens count from 0, padding is skipped."""
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, -new:].astype(np.int64)
