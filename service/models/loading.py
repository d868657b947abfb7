"""How a model folder becomes a served pipeline: checked and opened off the event loop
(``engine/repository.py``), then its pipeline built from the settings (``pipelines/factory.py``).

At start-up for every folder (``startup``), and while serving for one folder by name (``build``, what
``ModelHost.load`` swaps in). A name is one folder of the repository and nothing else: no
separator, no ``..``, whatever a client sends. A link the operator put in the repository is followed,
as at start-up (a client cannot make one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from service.engine.manifest import MANIFEST
from service.engine.repository import ModelLoadError, load_model, load_repository, served_bytes, without_paths
from service.engine.runtime import RuntimeOptions
from service.engine.versions import VersionFolder, VersionPolicyError, policy_of, version_folders
from service.errors import InvalidInputError, ModelFolderNotFoundError, ModelLoadFailedError
from service.models.registry import ModelRegistry
from service.observe.metrics import Metrics
from service.pipelines.base import ModelPipeline
from service.pipelines.factory import build_pipeline
from service.settings import Settings

log = logging.getLogger(__name__)

# A model's name: one folder of the repository (the publisher's work folders end in .partial).
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def runtime_options(settings: Settings) -> RuntimeOptions:
    return RuntimeOptions(
        device=settings.device,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        variant=settings.model_variant,
        spinning=settings.intra_op_spinning,
        kv_cache=settings.kv_cache,
        instances=settings.model_instances,
        cuda_graphs=settings.cuda_graphs,
        tensorrt=settings.tensorrt,
        tensorrt_cache_dir=settings.tensorrt_cache_dir,
        max_batch_size=settings.max_batch_size,
    )


@dataclass(frozen=True)
class Loader:
    settings: Settings
    metrics: Metrics | None = None

    @property
    def root(self) -> Path:
        return self.settings.model_repository

    def folder(self, name: str) -> Path:
        """The folder of model ``name``: a name that is not one folder of the repository is refused (400)."""
        if not MODEL_NAME.fullmatch(name) or ".." in name or name.endswith(".partial"):
            raise InvalidInputError(
                f"{name!r} is not a model name: letters, digits, '.', '_' and '-', naming one folder of the "
                "model repository",
                "model_name",
                "invalid_name",
            )
        return self.root / name

    def folders(self) -> list[str]:
        """The model folders the repository holds now (work folders and hidden ones aside)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and MODEL_NAME.fullmatch(p.name) and not p.name.endswith(".partial")
        )

    def servable(self, name: str) -> bool:
        """Whether ``name`` is a model this service may load on demand: a folder of the repository, and
        one of SERVED_MODELS when that names any."""
        only = self.settings.served_models
        if only and name not in only:
            return False
        try:
            return self.folder(name).is_dir()
        except InvalidInputError:
            return False

    def default_for(self, task: str, preferred: str | None) -> str | None:
        """The folder a request for ``task`` without a model would load: ``preferred`` when it serves the task,
        else the first such folder by name (None: no folder serves it)."""
        candidates = [n for n in self.folders() if self.servable(n) and self.task_of(n) == task]
        return preferred if preferred in candidates else next(iter(candidates), None)

    def task_of(self, name: str) -> str | None:
        """The task its newest version's manifest names (None: unreadable)."""
        try:
            versions = version_folders(self.folder(name))
            raw = json.loads((versions[-1].path / MANIFEST).read_text())
        except (OSError, ValueError, IndexError, InvalidInputError):
            return None
        task = raw.get("task") if isinstance(raw, dict) else None
        return task if isinstance(task, str) else None

    def served_bytes(self, name: str) -> int:
        """What a first load of model ``name`` is expected to take before it is measured: the files that the
        versions its policy serves would open (each one's served variant only, ``served_bytes``); 0 for a
        name that is not a folder of the repository."""
        try:
            folder = self.folder(name)
            chosen = policy_of(folder, self.settings.model_version_policy.get(name)).choose(
                version_folders(folder)
            )
        except (OSError, InvalidInputError, VersionPolicyError):
            return 0
        options = runtime_options(self.settings)
        return sum(served_bytes(v.path, options) for v in chosen)

    async def startup(self, only: list[str] | None) -> ModelRegistry:
        """Every folder (or those ``only`` names), loaded off the event loop; a broken one is refused."""
        loaded, refused = await asyncio.to_thread(
            load_repository,
            self.root,
            runtime_options(self.settings),
            only=only,
            policies=self.settings.model_version_policy,
        )
        pipelines: list[ModelPipeline] = []
        for name, versions in loaded.items():
            try:
                pipelines += [build_pipeline(model, self.settings, self.metrics) for model in versions]
            except Exception as exc:  # a manifest the loader accepted but a pipeline cannot use
                log.error("refusing model %s: %r", name, exc)
                refused[name] = f"cannot serve: {exc!r}"
        return ModelRegistry(pipelines, refused)

    async def build(
        self, name: str, keep: list[ModelPipeline]
    ) -> tuple[list[ModelPipeline], list[ModelPipeline]]:
        """The pipelines of every version of model ``name`` that its policy serves, and those of them built
        now (not yet started): a pipeline of ``keep`` whose version folder and files are unchanged is
        reused. Every check of start-up applies; ``ModelLoadFailedError`` names the first that fails."""
        folder = self.folder(name)
        if not folder.is_dir():
            raise ModelFolderNotFoundError(name)
        try:
            chosen = policy_of(folder, self.settings.model_version_policy.get(name)).choose(
                version_folders(folder)
            )
        except VersionPolicyError as exc:
            raise ModelLoadFailedError(name, str(exc)) from exc
        if not chosen:
            raise ModelLoadFailedError(
                name, "no manifest.json, and no numbered version folder its policy serves"
            )
        versions: list[ModelPipeline] = []
        built: list[ModelPipeline] = []
        try:
            for version in chosen:
                same = _unchanged(keep, version)
                if same is not None:
                    versions.append(same)
                    continue
                pipeline = await self._build_version(name, folder, version)
                built.append(pipeline)
                versions.append(pipeline)
        except ModelLoadFailedError:
            for pipeline in built:
                pipeline.model.free()
            raise
        return versions, built

    async def _build_version(self, name: str, folder: Path, version: VersionFolder) -> ModelPipeline:
        options = runtime_options(self.settings)
        try:
            model = await asyncio.to_thread(load_model, folder, options, True, version)
        except ModelLoadError as exc:
            log.error("cannot load model folder %s: %s", version.path, exc)
            where = f"version {version.label}: " if version.label else ""
            raise ModelLoadFailedError(name, where + without_paths(str(exc), self.root)) from exc
        try:
            return build_pipeline(model, self.settings, self.metrics)
        except Exception as exc:
            model.free()
            raise ModelLoadFailedError(name, f"cannot serve: {exc!r}") from exc


def _unchanged(serving: list[ModelPipeline], version: VersionFolder) -> ModelPipeline | None:
    """The serving pipeline of ``version`` when its folder's manifest still names the served files."""
    try:
        on_disk = json.loads((version.path / MANIFEST).read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return next((p for p in serving if (p.model.label, p.model.version) == (version.label, on_disk)), None)
