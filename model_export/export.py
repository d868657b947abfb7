"""The export stage: a trained model's graphs, attention maps, tokenizer and manifest, written as its folder."""

from __future__ import annotations

import logging
import platform
import shutil
from pathlib import Path
from typing import Any

import torch

from .attention_graphs import export_attention_maps
from .manifest import write_manifest
from .onnx_export import OPSET, GraphSpec, export_graph
from .recipes.common import BuildContext, Trained

log = logging.getLogger(__name__)


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def export_model(ctx: BuildContext[Any], trained: Trained, graphs: dict[str, GraphSpec]) -> dict[str, Any]:
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
    attention_maps = export_attention_maps(trained, build_dir, ctx.seed)  # None: a model without maps
    if attention_maps is not None:
        served.append(attention_maps["file"])
    manifest = {
        "name": ctx.name,
        **trained.manifest,
        "graphs": exported,
        **({"attention_maps": attention_maps} if attention_maps is not None else {}),
        "training": {
            "profile": ctx.profile,
            "seed": ctx.seed,
            **trained.training,
            **trained.result.summary(),
            "curve": "training_curve.png" if (build_dir / "training_curve.png").is_file() else None,
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
