"""What a door may know of a served model: a read-only view, so that no door holds a pipeline or the registry."""

from __future__ import annotations

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

    @classmethod
    def of(cls, pipeline: ModelPipeline, default_for: list[str]) -> ServedModel:
        m = pipeline.model
        return cls(m.name, m.version, m.task, m.manifest, m, tuple(default_for), pipeline.contract)

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
