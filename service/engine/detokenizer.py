"""Incremental detokenization: the text each new token adds, safe to stream."""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"  # what a byte-level BPE decode shows for a character cut mid-way


class IncrementalDetokenizer:
    """Streaming text of one sequence: each step decodes all generated ids and hands out the new suffix.

    Held back until the next token settles it: a trailing U+FFFD (byte-level BPE
    cut a character mid-way) and a trailing piece that could be the start of a stop
    string (once handed out, text cannot be taken back). So the pieces handed out
    always join to the final text, which stops before the first stop string.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._longest = max(map(len, self._stop), default=0)
        self._searched = 0  # length of the settled text already searched for stop strings
        self.text = ""  # handed out so far
        self.stopped = False

    def step(self, ids: list[int], stop_allowed: bool = True) -> str:
        """The text that the newest of ``ids`` adds (may be ""); sets ``stopped`` on a stop string.

        With ``stop_allowed`` False (before ``min_tokens``), stop strings are not looked for: the text
        is handed out whole, and a later search starts after it (vLLM's rule: a stop string that ends
        before ``min_tokens`` does not count)."""
        settled = self._decode(ids).rstrip(REPLACEMENT_CHAR)
        if not stop_allowed:
            piece = self._hand_out(settled)
            self._searched = len(settled) + self._longest - 1  # the next search starts after this text
            return piece
        cut = self._find_stop(settled)
        if cut is not None:
            self.stopped = True
            return self._hand_out(settled[:cut])
        return self._hand_out(settled[: len(settled) - self._stop_prefix(settled)])

    def flush(self, ids: list[int]) -> str:
        """The sequence ended without a stop string: hand out everything held back."""
        return self._hand_out(self._decode(ids))

    def _hand_out(self, upto: str) -> str:
        piece = upto[len(self.text) :]
        self.text += piece
        return piece

    def _find_stop(self, settled: str) -> int | None:
        """Start of the earliest stop string in ``settled``; only text new since the last step can hold a new one."""
        start = max(0, self._searched - self._longest + 1)
        self._searched = len(settled)
        found = [i for i in (settled.find(s, start) for s in self._stop) if i >= 0]
        return min(found) if found else None

    def _stop_prefix(self, settled: str) -> int:
        """Length of the longest suffix of ``settled`` that is a proper prefix of some stop string."""
        for k in range(min(self._longest - 1, len(settled)), 0, -1):
            if any(s.startswith(settled[-k:]) for s in self._stop if len(s) > k):
                return k
        return 0
