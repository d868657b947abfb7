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

from ..manifest import write_manifest
from ..onnx_export import OPSET, GraphSpec, export_graph
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

    @property
    def model_dir(self) -> Path:
        return self.out_dir / self.name

    def limit(self, items: list[Any], key: str) -> list[Any]:
        """The first `settings[key]` items (None = all): the tiny profile trains on a slice."""
        n = self.settings.get(key)
        return items if n is None else items[:n]

    def budget(self, key: str = "budget_s") -> float:
        return float(self.settings[key])


def fresh_model_dir(ctx: BuildContext) -> Path:
    """Build into <name>.partial and swap at the end, so a failed build never leaves a half folder served."""
    partial = ctx.out_dir / f"{ctx.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


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


def finish(
    ctx: BuildContext,
    build_dir: Path,
    tokenizer: Tokenizer | None,
    graphs: dict[str, GraphSpec],
    manifest: dict[str, Any],
    training: dict[str, Any],
    result: TrainResult,
) -> dict[str, Any]:
    """Export the graphs, write tokenizer + manifest, then move the folder into place."""
    served = []
    if tokenizer is not None:
        tokenizer.save(str(build_dir / "tokenizer.json"))
        served.append("tokenizer.json")
    exported = {}
    for role, spec in graphs.items():
        exported[role] = export_graph(spec, build_dir)
        served.append(spec.file)
    manifest = {
        "name": ctx.name,
        **manifest,
        "graphs": exported,
        "training": {
            "profile": ctx.profile,
            "seed": ctx.seed,
            **training,
            **result.summary(),
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
