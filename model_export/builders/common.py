"""What every builder shares: its context, the kv-cache layout entry, and writing the model folder."""

from __future__ import annotations

import copy
import dataclasses
import logging
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from tokenizers import Tokenizer
from torch import nn

from ..manifest import write_manifest
from ..onnx_export import OPSET, GraphSpec, export_graph
from ..profiles import Recipe
from ..training import TrainResult, TrainSpec, optimizer_for, train, train_step

__all__ = ["GraphSpec"]

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Recipe)


@dataclass
class BuildContext(Generic[R]):
    name: str
    data_dir: Path
    out_dir: Path
    profile: str
    recipe: R
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


LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, int, int]]


@dataclass
class TrainingJob:
    """Everything a model's training needs, prepared but not run: what the warm-up times and `run` trains.

    `batches(seed)` starts a fresh, endless stream of batches, so the warm-up
    can draw its own without touching the one the real run sees.
    """

    ctx: BuildContext[Any]
    model: nn.Module
    batches: Callable[[int], Iterator[Any]]
    loss_fn: LossFn
    unit: str
    finish: Callable[[TrainResult], Trained]
    spec: TrainSpec = field(init=False)  # the recipe's; the --max-minutes guard gives it a deadline

    def __post_init__(self) -> None:
        self.spec = dataclasses.replace(self.ctx.recipe.train, device=self.ctx.device)

    def run(self) -> Trained:
        result = train(
            self.model,
            self.batches(self.ctx.seed),
            self.loss_fn,
            self.spec,
            self.ctx.name,
            self.unit,
            self.ctx.work_dir / "training_curve.png",
        )
        return self.finish(result)

    def seconds_per_step(self, seconds: float = 2.0, min_batches: int = 2, max_batches: int = 8) -> float:
        """Time optimizer steps on a copy of the model: the build estimate's input.

        A first pass runs fresh batches until `seconds` have passed (between
        `min_batches` and `max_batches`) and pays the one-off costs of each new
        batch shape (allocations, kernel selection); the second pass over the
        same batches is timed, which is what the real run's steps cost once its
        shapes have all been seen. The copy, its own batches and a forked RNG
        leave the real run exactly as it would have been.
        """
        with torch.random.fork_rng(devices=[]):
            model = copy.deepcopy(self.model).to(self.spec.device).train()
            optimizer = optimizer_for(model, self.spec)
            stream = self.batches(self.ctx.seed + 7919)
            lr = self.spec.learning_rate(self.spec.warmup_steps)
            sample: list[Any] = []
            start = time.perf_counter()
            while len(sample) < max_batches and (
                len(sample) < min_batches or time.perf_counter() - start < seconds
            ):
                sample.append(next(stream))
                train_step(model, optimizer, sample[-1], self.loss_fn, self.spec, lr)
            start = time.perf_counter()
            for batch in sample:
                train_step(model, optimizer, batch, self.loss_fn, self.spec, lr)
            return (time.perf_counter() - start) / len(sample)


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


# The token inputs of every KV-cached decoder graph, in call order: the new tokens, a mask over the
# cached past and the new tokens, and the new tokens' positions.
DECODER_TOKEN_AXES: dict[str, list[str | int]] = {
    "input_ids": ["batch", "sequence"],
    "attention_mask": ["batch", "total_sequence"],
    "position_ids": ["batch", "sequence"],
}


def past_names(num_layers: int, prefix: str) -> list[str]:
    return [f"{prefix}_{kind}.{i}" for i in range(num_layers) for kind in ("key", "value")]


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
    from ..attention_graphs import export_attention_maps  # it builds on the builders: imported late

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
