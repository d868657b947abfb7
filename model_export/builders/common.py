"""What every builder shares: its context, the kv-cache layout entry, and writing the model folder."""

from __future__ import annotations

import logging
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from ..manifest import write_manifest
from ..onnx_export import OPSET, GraphSpec, export_graph

__all__ = ["GraphSpec"]
from ..training import TrainResult

log = logging.getLogger(__name__)


@dataclass
class BuildContext:
    name: str
    data_dir: Path
    out_dir: Path
    profile: str
    settings: dict[str, Any]
    seed: int = 0
    init_from: Path | None = None
    device: str = "cpu"

    @property
    def model_dir(self) -> Path:
        return self.out_dir / self.name

    @property
    def work_dir(self) -> Path:
        """Where training leaves its checkpoint and curves until export writes the model folder."""
        path = self.out_dir / ".work" / self.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def limit(self, items: list[Any], key: str) -> list[Any]:
        """The first `settings[key]` items (None = all): the tiny profile trains on a slice."""
        n = self.settings.get(key)
        return items if n is None else items[:n]

    def budget(self, key: str = "budget_s") -> float:
        return float(self.settings[key])


@dataclass
class Trained:
    """What training hands to export: the module, its tokenizer and the manifest fields it knows."""

    name: str
    model: nn.Module
    tokenizer: Tokenizer | None
    manifest: dict[str, Any]
    training: dict[str, Any]
    result: TrainResult

    def save(self, path: Path) -> None:
        state = {**self.__dict__, "tokenizer": self.tokenizer.to_str() if self.tokenizer else None}
        torch.save(state, path)

    @classmethod
    def load(cls, path: Path) -> Trained:
        if not path.is_file():
            raise FileNotFoundError(
                f"no trained checkpoint at {path}: run `python -m model_export train` first"
            )
        state = torch.load(path, weights_only=False)
        state["tokenizer"] = Tokenizer.from_str(state["tokenizer"]) if state["tokenizer"] else None
        return cls(**state)


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def kv_cache_layout(num_layers: int, num_heads: int, head_dim: int) -> dict[str, Any]:
    return {
        "num_layers": num_layers,
        "num_heads": num_heads,
        "head_dim": head_dim,
        "dtype": "float32",
        "axes": ["batch", "num_heads", "past_sequence", "head_dim"],
        "past_key": "past_key.{i}",
        "past_value": "past_value.{i}",
        "present_key": "present_key.{i}",
        "present_value": "present_value.{i}",
    }


def past_names(num_layers: int, prefix: str) -> list[str]:
    return [f"{prefix}_{kind}.{i}" for i in range(num_layers) for kind in ("key", "value")]


def export_model(ctx: BuildContext, trained: Trained, graphs: dict[str, GraphSpec]) -> dict[str, Any]:
    """Export the graphs, write tokenizer + manifest + curves into <name>.partial, then swap it into place.

    Building beside the live folder means a failed export never leaves a
    half-written model where the service would load it.
    """
    build_dir = fresh_dir(ctx.out_dir / f"{ctx.name}.partial")
    for png in sorted(ctx.work_dir.glob("*.png")):
        shutil.copy2(png, build_dir / png.name)
    served = []
    if trained.tokenizer is not None:
        trained.tokenizer.save(str(build_dir / "tokenizer.json"))
        served.append("tokenizer.json")
    exported = {}
    for role, spec in graphs.items():
        exported[role] = export_graph(spec, build_dir)
        served.append(spec.file)
    manifest = {
        "name": ctx.name,
        **trained.manifest,
        "graphs": exported,
        "training": {
            "profile": ctx.profile,
            "seed": ctx.seed,
            **trained.training,
            **trained.result.summary(),
            "curve": "training_curve.png",
        },
        "export": {
            "exporter": "torch.onnx.export(dynamo=True)",
            "opset": OPSET,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "parity_max_abs_diff": max(g["parity_max_abs_diff"] for g in exported.values()),
        },
    }
    written = write_manifest(build_dir, manifest, served)
    final = ctx.model_dir
    shutil.rmtree(final, ignore_errors=True)
    build_dir.rename(final)
    log.info("%s: version %s written to %s", ctx.name, written["version"], final)
    return written
