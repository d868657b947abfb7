"""Resident memory back near where it was after a burst: freed heap pages returned to the OS.

glibc keeps the memory a burst of large requests freed (a few hundred MiB after fifty 4 MB bodies)
for its own later use, and returns it only from the top of each heap; Python's and numpy's small
objects leave the rest of those heaps fragmented, so resident memory climbs burst after burst and
stays there. ``malloc_trim(0)`` hands every free page back. Measured on the tiny models, six bursts
of fifty 4 MB refused bodies (``benchmarks/memory_bursts.py``, RESULTS.md): resident memory ended
148 -> 180 MiB with the trimmer, 148 -> 320-380 MiB with glibc as it is, with MALLOC_ARENA_MAX=2,
a fixed 1 MiB MALLOC_MMAP_THRESHOLD_ (with or without a trim threshold) or jemalloc.

A trim costs a few milliseconds (8 ms on average, 18 at most, measured on a 300 MiB heap) on a
thread of its own, so it is not run blindly: once a second the trimmer reads the process's resident
size (one small read of /proc), and trims only when it has grown MALLOC_TRIM_MIB past where the last
trim left it. Memory that is really in use is therefore trimmed at most once per MALLOC_TRIM_MIB of
growth. Where there is no glibc (musl, macOS) the trimmer does nothing.
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


class MemoryTrimmer:
    """Returns freed heap memory to the OS after resident memory grew ``growth_mib`` (module docstring)."""

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
        floor = resident_bytes()
        while True:
            await asyncio.sleep(self.interval_s)
            before = resident_bytes()
            floor = min(floor, before)  # memory given back by itself lowers the mark
            if before - floor < self.growth:
                continue
            await asyncio.to_thread(self._trim, 0)
            floor = resident_bytes()
            self.trims += 1
            self.released += max(0, before - floor)
            log.debug("malloc_trim: resident %d -> %d MiB", before >> 20, floor >> 20)
