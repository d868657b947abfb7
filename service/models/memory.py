"""Resident memory back near where it was after a burst: freed heap memory returned to the OS.

glibc keeps the memory a burst of large requests freed (a few hundred MiB after fifty 4 MB bodies)
for its own later use, and returns it only from the top of each heap; Python's and numpy's small
objects leave the rest of those heaps fragmented, so resident memory climbs burst after burst and
stays there. ``malloc_trim(0)`` hands every free page back. Measured side by side
(``benchmarks/memory_bursts.py``, its table in benchmarks/RESULTS.md, 2-core Intel Xeon): after six
bursts of fifty ~4 MB refused bodies, resident memory rested 37 MiB above its start with this
trimmer, and 109-181 MiB above it with glibc as it is, MALLOC_ARENA_MAX=2, a fixed 1 MiB
MALLOC_MMAP_THRESHOLD_ (with or without a trim threshold) or jemalloc; the trimmer with
MALLOC_ARENA_MAX=2 as well rested at the same 37, so the service sets no allocator variable.

A trim takes a few milliseconds (8 ms on average, 18 at most, measured on a 300 MiB heap) on a thread
of its own. Once a second the trimmer reads the resident size (one small read of /proc); while it is
MALLOC_TRIM_MIB or more above its resting level (its lowest since start-up), it trims. A trim that
gave much back (a quarter of MALLOC_TRIM_MIB) means a burst is ending: look again in a second. One
that gave little means the memory is in use (or the burst goes on): the looks space out to every
MAX_BACKOFF seconds, never longer, because what a burst frees at its end shows in no figure this
process can read cheaply (freed memory stays resident until trimmed), so only looking again finds
it. Where there is no glibc (musl, macOS) the trimmer does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
MAX_BACKOFF = 4  # while trims give little back, the looks space out to this many intervals
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def resident_bytes() -> int:
    """This process's resident set size (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def trim_now() -> None:
    """Hand freed heap memory back to the OS at once (where glibc can): before a load is measured."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class MemoryTrimmer:
    """Returns freed heap memory to the OS while resident memory is ``growth_mib`` past its resting level
    (module docstring)."""

    def __init__(self, growth_mib: int, interval_s: float = CHECK_INTERVAL_S) -> None:
        self.growth = growth_mib * 1024 * 1024
        self.interval_s = interval_s
        self._trim = _malloc_trim() if growth_mib > 0 else None
        self._task: asyncio.Task[None] | None = None
        self.trims = 0
        self.released = 0  # bytes of resident memory the trims gave back

    @property
    def active(self) -> bool:
        return self._trim is not None and resident_bytes() > 0

    def start(self) -> None:
        if self.active and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memory-trimmer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        assert self._trim is not None
        resting = resident_bytes()  # once the models are loaded and warm
        wait = self.interval_s
        while True:
            await asyncio.sleep(wait)
            before = resident_bytes()
            resting = min(resting, before)
            if before - resting < self.growth:
                wait = self.interval_s
                continue
            await asyncio.to_thread(self._trim, 0)
            after = resident_bytes()
            self.trims += 1
            self.released += max(0, before - after)
            log.debug("malloc_trim: resident %d -> %d MiB", before >> 20, after >> 20)
            # Much came back: a burst is ending, look again soon. Little did: the memory is in use (or a
            # burst is still on), so look less often, though never less than every MAX_BACKOFF intervals:
            # the memory a burst frees shows in no figure read here, so the trim after its end must come
            # from looking again.
            freed_much = before - after >= self.growth // 4
            wait = self.interval_s if freed_much else min(wait * 2, self.interval_s * MAX_BACKOFF)
