"""MODEL_MEMORY_BUDGET: what each loaded version holds resident, measured as it loads, and which model was
used least recently (``ModelHost`` decides what to load and unload)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from service.pipelines.base import ModelPipeline


class MemoryBudget:
    def __init__(self, budget: int) -> None:
        self.budget = budget  # bytes; 0: none
        self._sizes: dict[ModelPipeline, int] = {}  # each resident version's bytes, measured at its load
        self._last_size: dict[str, int] = {}  # each model's last measurement: its next load's estimate
        self._last_version_size: dict[str, int] = {}  # what one version of each model was counted
        self._used_at: dict[str, float] = {}
        self._one_load = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @contextlib.asynccontextmanager
    async def measuring(self) -> AsyncIterator[None]:
        """With a budget, one load at a time: the process's growth while it runs is that model's alone."""
        if not self.enabled:
            yield
            return
        async with self._one_load:
            yield

    def expected(self, name: str, on_disk: int) -> int:
        """What loading ``name`` will take: its last measurement, else its files' size on disk."""
        return self._last_size.get(name, on_disk)

    def record(self, pipeline: ModelPipeline, grown: int, floor: int) -> int:
        """Count what ``pipeline`` holds: the process's growth while it loaded, never less than its files
        (``floor``) nor than this model's earlier measurement, since a load into memory that an unloaded
        model freed grows the process less than it takes. Returns the figure counted."""
        size = max(grown, floor, self._last_version_size.get(pipeline.name, 0))
        self._sizes[pipeline] = size
        self._last_version_size[pipeline.name] = size
        self._last_size[pipeline.name] = sum(s for p, s in self._sizes.items() if p.name == pipeline.name)
        return size

    def forget(self, pipeline: ModelPipeline) -> None:
        self._sizes.pop(pipeline, None)

    def used(self) -> int:
        return sum(self._sizes.values())

    def size_of(self, pipeline: ModelPipeline) -> int | None:
        return self._sizes.get(pipeline)

    def over(self) -> bool:
        return self.enabled and self.used() > self.budget

    def touch(self, name: str) -> None:
        self._used_at[name] = time.monotonic()

    def last_used(self, name: str) -> float:
        return self._used_at.get(name, 0.0)
