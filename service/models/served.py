"""What a door may know of a served model: a read-only view, so that no door holds a pipeline or the registry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.engine.manifest import Manifest
from service.engine.repository import LoadedModel
from service.pipelines.base import ModelPipeline
from service.pipelines.contract import TaskContract


@dataclass(frozen=True)
class ServedModel:
    """One loaded model: its name, version, task and manifest, where it runs, and what it is the default for."""

    name: str
    version: str  # the manifest's content hash of the served files
    task: str
    manifest: Manifest
    loaded: LoadedModel  # read-only: provider, variant, in-place KV cache, folder
    default_for: tuple[str, ...]  # the tasks a request without `model` sends here
    contract: TaskContract  # its task's inputs, outputs and parameters
    label: str = ""  # its version folder's number ("": a flat model folder, its only version)
    versions: tuple[str, ...] = ()  # every served version of the model, newest first: number or hash

    @classmethod
    def of(
        cls, pipeline: ModelPipeline, default_for: list[str], versions: Sequence[ModelPipeline] = ()
    ) -> ServedModel:
        m = pipeline.model
        served = tuple(p.model.label or p.model.version for p in versions) or (m.label or m.version,)
        return cls(
            m.name, m.version, m.task, m.manifest, m, tuple(default_for), pipeline.contract, m.label, served
        )

    @property
    def ref(self) -> str:
        """How a core call names exactly this version (``name@version``): the one resolved, even if a newer
        one is loaded meanwhile."""
        return f"{self.name}@{self.version}"

    @property
    def sizes(self) -> dict[str, int]:
        """The model's own sizes that its contract's shapes name (``labels``, ``dimensions``)."""
        sizes = {"labels": len(self.labels)}
        if self.manifest.embedding is not None:
            sizes["dimensions"] = self.manifest.embedding.dimensions
        return sizes

    @property
    def labels(self) -> list[str]:
        return list(self.manifest.labels or [])

    def token_text(self, token_id: int) -> str:
        """One token decoded alone (what OpenAI's logprobs show, as vLLM does)."""
        assert self.loaded.tokenizer is not None, f"{self.name} has no tokenizer"
        return self.loaded.tokenizer.decode([token_id])
