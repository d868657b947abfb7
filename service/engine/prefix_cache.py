"""Automatic prefix caching: the keys/values of prompt prefixes, kept and shared across requests.

A prompt is cut into blocks of ``block_tokens`` tokens. Block j's key is a hash of every token up to
its end (its own tokens chained onto the key of block j - 1), so a block is only ever found by a prompt
that starts with exactly the same tokens, at the same positions: its keys/values are then exactly what
recomputing them would give (vLLM's and TGI's scheme). A prefill stores every full block of its
prompts; a later prompt reuses the longest run of its leading blocks that is resident, and computes only
the rest (``DecoderGraph.prefill_all`` with a past). Blocks are shared by every sequence that starts with
them, and evicted least recently used first once their bytes would pass ``max_bytes``.

A request's ``cache_salt`` (vLLM's: the caller's tenant, ``keys.prefix_salt``) enters the first block's
hash, so its blocks are found only by prompts of the same salt: one tenant never reuses another's cached
prompt, nor learns from a fast first token that someone sent it. "" is the shared space.

A prompt always computes at least its last token (its logits pick the first new token), so at most
``(len - 1) // block_tokens`` blocks are reused. Only the engine's compute thread touches the cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PrefixCache", "PrefixStats"]


@dataclass(frozen=True)
class PrefixStats:
    """Counts since start: prompt tokens looked up and found; what is resident now."""

    queried_tokens: int
    hit_tokens: int
    blocks: int
    bytes: int


class PrefixCache:
    """Blocks of past keys/values, (past names, heads, block_tokens, head_dim) each, by prefix hash."""

    def __init__(self, block_tokens: int, max_bytes: int) -> None:
        assert block_tokens >= 1 and max_bytes > 0, "a prefix cache needs a block size and a memory bound"
        self.block_tokens = block_tokens
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[bytes, np.ndarray] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.queried_tokens = 0
        self.hit_tokens = 0

    def keys(self, tokens: Sequence[int], blocks: int, salt: str = "") -> list[bytes]:
        """The keys of the first ``blocks`` full blocks of ``tokens``, the chain started from ``salt``."""
        keys, key = [], salt.encode()
        size = self.block_tokens
        for j in range(blocks):
            chunk = np.asarray(tokens[j * size : (j + 1) * size], dtype=np.int64).tobytes()
            key = hashlib.blake2b(key + chunk, digest_size=16).digest()
            keys.append(key)
        return keys

    def reusable(self, prompt: Sequence[int], salt: str = "") -> int:
        """How many leading tokens of ``prompt`` resident blocks of ``salt`` hold (its last token never: it
        is computed)."""
        found = 0
        for key in self.keys(prompt, (len(prompt) - 1) // self.block_tokens, salt):
            if key not in self._blocks:
                break
            found += 1
        return found * self.block_tokens

    def lookup(self, prompt: Sequence[int], tokens: int, salt: str = "") -> np.ndarray:
        """The keys/values of ``prompt``'s first ``tokens`` (at most ``reusable``), (names, H, tokens, Dh);
        the blocks become the most recently used. Counts the lookup in the hit rate."""
        self.queried_tokens += len(prompt)
        self.hit_tokens += tokens
        blocks = -(-tokens // self.block_tokens)
        parts = []
        for key in self.keys(prompt, blocks, salt):
            self._blocks.move_to_end(key)
            parts.append(self._blocks[key])
        return np.concatenate(parts, axis=2)[:, :, :tokens]

    def missed(self, prompt: Sequence[int]) -> None:
        """A prompt prefilled without the cache: counted in the hit rate as a miss."""
        self.queried_tokens += len(prompt)

    def store(
        self, prompt: Sequence[int], tensors: Sequence[np.ndarray], row: int, end: int, salt: str = ""
    ) -> None:
        """Keep every full block of ``prompt`` from a prefill's present ``tensors`` (host arrays, (B, H, W,
        Dh) per past name), where row ``row``'s prompt ends at column ``end`` (exclusive)."""
        size = self.block_tokens
        start = end - len(prompt)
        for j, key in enumerate(self.keys(prompt, len(prompt) // size, salt)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            block = np.stack([t[row, :, start + j * size : start + (j + 1) * size] for t in tensors])
            if block.nbytes > self.max_bytes:
                return
            self._blocks[key] = block
            self._bytes += block.nbytes
            while self._bytes > self.max_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self._bytes -= evicted.nbytes

    def stats(self) -> PrefixStats:
        return PrefixStats(self.queried_tokens, self.hit_tokens, len(self._blocks), self._bytes)
