"""What every recipe shares: its build context, the training job it prepares, and the trained model it hands on."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from tokenizers import Tokenizer
from torch import nn

from ..profiles import Recipe
from ..training import Probe, TrainResult, TrainSpec, optimizer_for, train, train_step

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
    stage_dir: Path | None = None  # --publish-version: the model is built here, then published

    @property
    def model_dir(self) -> Path:
        return (self.stage_dir or self.out_dir) / self.name

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
    probe: Probe | None = None  # the validation metric measured at the recipe's probe points
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
            self.probe,
            self.ctx.recipe.probe_points,
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
