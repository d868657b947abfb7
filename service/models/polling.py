"""MODEL_CONTROL_MODE=poll: the repository scanned every MODEL_REPOSITORY_POLL_S, and the model host told what
changed. A new folder, or one whose manifest names another version than the one serving, is loaded (the
same swap as an explicit load: ``ModelHost.load``); a served model whose folder is gone for two
scans in a row is unloaded (one scan may fall between the publisher's removal of the old folder and
its rename of the new one).

A plain scan, not a file watcher: it lists each model folder and reads the ``stat`` of its manifests
and ``config.json``, loading only where one changed. That costs 0.24 ms for 10 folders and 25 ms for
1000 (``benchmarks/model_loads.py``), and it sees what another host writes to a shared volume (NFS, a
Kubernetes PVC), where inotify, and so ``watchfiles``, sees nothing.
A version that fails to load is not tried again until its manifest changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from service.engine.manifest import MANIFEST
from service.engine.versions import CONFIG
from service.errors import ServiceError
from service.models.loading import Loader

if TYPE_CHECKING:
    from service.models.host import ModelHost

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int], ...]  # (file, mtime_ns, size) of each manifest and config.json


class RepositoryPoller:
    def __init__(
        self, host: ModelHost, loader: Loader, interval_s: float, only: list[str] | None = None
    ) -> None:
        self.host = host
        self.loader = loader
        self.interval_s = interval_s
        self.only = set(only) if only else None
        self._seen: dict[str, Fingerprint] = {}  # each folder's manifest as last read
        self._missing: dict[str, int] = {}  # scans in a row that a served model's folder was absent
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.scan()
            except Exception:  # a scan that fails (a volume gone for a moment) must not end polling
                log.exception("scanning the model repository failed; the next scan tries again")

    def _fingerprint(self, name: str) -> Fingerprint | None:
        """The stat of the folder's manifest(s) (its own, or each numbered version folder's) and config.json;
        None while it holds no manifest (being written)."""
        folder = self.loader.root / name
        try:
            candidates = [folder / MANIFEST, folder / CONFIG]
            candidates += [sub / MANIFEST for sub in folder.iterdir() if sub.name.isdigit()]
        except OSError:
            return None
        stats = []
        for path in sorted(candidates):
            try:
                stat = path.stat()
            except OSError:
                continue
            stats.append((str(path.relative_to(folder)), stat.st_mtime_ns, stat.st_size))
        return tuple(stats) if any(f.endswith(MANIFEST) for f, _, _ in stats) else None

    async def scan(self) -> None:
        """One scan: load what is new or changed, unload what is gone."""
        folders = {n for n in self.loader.folders() if self.only is None or n in self.only}
        served = set(self.host.registry.versions)
        for name in sorted(folders):
            fingerprint = self._fingerprint(name)
            if fingerprint is None or fingerprint == self._seen.get(name):
                continue  # no manifest yet (being written), or nothing changed since the last read
            if name in self._seen or name not in served:
                log.info("%s: the repository's folder changed; loading what changed", name)
            self._seen[name] = fingerprint
            try:  # only the versions whose files changed are built (changed_only)
                await self.host.load(name, changed_only=True)
            except ServiceError as exc:  # the serving versions, if any, serve on; logged by the loader
                log.warning("%s: not loaded: %s", name, exc)
        for name in served - folders:
            self._missing[name] = self._missing.get(name, 0) + 1
            if self._missing[name] >= 2:
                log.info("%s: its folder is gone from the repository; unloading it", name)
                del self._missing[name]
                self._seen.pop(name, None)
                with contextlib.suppress(ServiceError):
                    await self.host.unload(name)
        for name in folders:
            self._missing.pop(name, None)
