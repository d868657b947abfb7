"""One training loop for every model: AdamW, a step budget with its schedule, a progress bar and a loss curve.

Every model trains for a fixed number of optimizer steps, and the learning
rate (linear warmup, then cosine decay to `min_lr_ratio`) is a function of
the step alone. A slower or busier machine therefore takes longer and builds
the same model; it never builds a worse one. The only thing measured in
seconds is the optional guard `deadline_s` (`--max-minutes`), which stops a
run early and marks the result as under-trained.

A `Probe` measures the model's validation metric at a few evenly spaced steps
(in eval mode, on its own RNG stream, so the weights are those of a run
without it): the quality-against-steps curve that shows where each model
stands on its curve, written beside the loss curve.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSpec:
    """An optimizer-step budget and its learning-rate schedule: a recipe's, with the build's device and guard."""

    steps: int
    lr: float
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    min_lr_ratio: float = 0.05
    # Layer-wise learning-rate decay for fine-tuning a pretrained stack: each layer's rate is this
    # factor times the one above it (the head gets the full rate, the embeddings the least); 1.0: off.
    layer_decay: float = 1.0
    # Checkpoint averaging: the model ends as the mean of its weights after each of the last this
    # many steps (Vaswani et al. average the last checkpoints); 0: the last step's weights.
    average_last: int = 0
    device: str = "cpu"
    deadline_s: float | None = None  # wall-clock guard (seconds from the start of this run); None = none

    def learning_rate(self, step: int) -> float:
        """The rate for optimizer step `step` (0-based): warmup, then cosine decay over the step budget."""
        warm = min(1.0, (step + 1) / max(1, self.warmup_steps))
        progress = min(1.0, step / max(1, self.steps))
        return (
            self.lr
            * warm
            * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
        )


@dataclass(frozen=True)
class Probe:
    """A model's validation metric, measured on the torch module during training."""

    metric: str
    measure: Callable[[nn.Module], float]  # called in eval mode under torch.no_grad()
    examples: str  # what it scores, for the plot and the manifest
    higher_is_better: bool = True
    target: float | None = None

    def steps(self, total: int, points: int) -> list[int]:
        """``points`` evenly spaced steps of ``total``, the last one included."""
        return sorted({max(1, round(total * k / points)) for k in range(1, points + 1)}) if points else []


@dataclass
class TrainResult:
    steps: int
    planned_steps: int
    seconds: float
    examples: int
    units: int
    unit: str
    final_loss: float
    losses: list[float] = field(default_factory=list)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, probe value)
    probe: dict[str, Any] | None = None  # the probe's metric, examples and seconds

    @property
    def under_trained(self) -> bool:
        return self.steps < self.planned_steps

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "planned_steps": self.planned_steps,
            "under_trained": self.under_trained,
            "seconds": round(self.seconds, 1),
            "examples_seen": self.examples,
            f"{self.unit}_seen": self.units,
            f"{self.unit}_per_second": round(self.units / max(self.seconds, 1e-9), 1),
            "final_loss": round(self.final_loss, 4) if self.steps else None,  # no steps, no loss (not NaN)
            **(
                {"validation_curve": {**self.probe, "points": [[s, round(v, 4)] for s, v in self.curve]}}
                if self.probe is not None
                else {}
            ),
        }


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configure_threads() -> int:
    """Torch's intra-op threads: TORCH_NUM_THREADS, else one per logical CPU. Same threads, same weights."""
    threads = int(os.environ.get("TORCH_NUM_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)
    return threads


# AdamW's fused kernel (CPU and CUDA); False is torch's loop over tensors, what builds before
# 2026-11-26 trained with (the same update, rounded differently).
FUSED_ADAMW = True

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _depth(name: str, layers: int) -> int:
    """0 for embeddings, i + 1 for the stack's layer i, layers + 1 for everything above (the head)."""
    if "embeddings." in name:
        return 0
    match = _LAYER.search(name)
    return int(match.group(1)) + 1 if match else layers + 1


def _param_groups(model: nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict[str, Any]]:
    """No weight decay on biases, norms and embeddings-as-vectors (the usual AdamW practice).

    With ``layer_decay`` below 1, each group also carries its ``lr_scale``: ``layer_decay`` to the
    power of its distance from the head.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    layers = 1 + max((int(m.group(1)) for n, _ in named if (m := _LAYER.search(n))), default=-1)
    groups: dict[tuple[int, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, p in named:
        if id(p) in seen:
            continue
        seen.add(id(p))
        depth = _depth(name, layers) if layer_decay != 1.0 else 0
        groups.setdefault((depth, p.dim() >= 2), []).append(p)
    return [
        {
            "params": params,
            "weight_decay": weight_decay if decays else 0.0,
            "lr_scale": layer_decay ** (layers + 1 - depth) if layer_decay != 1.0 else 1.0,
        }
        for (depth, decays), params in sorted(groups.items(), key=lambda item: (not item[0][1], item[0][0]))
    ]


def optimizer_for(model: nn.Module, spec: TrainSpec) -> torch.optim.Optimizer:
    groups = _param_groups(model, spec.weight_decay, spec.layer_decay)
    # One fused kernel per update instead of a dozen ops per tensor: with 2 CPU threads the MiniLM
    # heads' AdamW step (22.6M parameters) takes 12 ms instead of 89, the translator's 3.7 instead of 23.
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(0.9, 0.98), eps=1e-8, fused=FUSED_ADAMW)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int, int]],
    spec: TrainSpec,
    lr: float,
) -> tuple[float, int, int]:
    """One optimizer step at learning rate `lr`: (loss, examples, units)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    loss, n_examples, n_units = loss_fn(model, to_device(batch, spec.device))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if spec.grad_clip:
        nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
    optimizer.step()
    return float(loss.detach()), n_examples, n_units


def train(
    model: nn.Module,
    batches: Iterator[Any],
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int, int]],
    spec: TrainSpec,
    desc: str,
    unit: str = "tokens",
    curve_path: Path | None = None,
    probe: Probe | None = None,
    probe_points: int = 0,
) -> TrainResult:
    """Train for `spec.steps` optimizer steps (fewer only if the `deadline_s` guard fires).

    `loss_fn(model, batch)` returns (loss, examples in the batch, units in the
    batch) where units are what throughput is counted in (tokens, images).
    `probe` is measured after each of `probe_points` evenly spaced steps; its
    time is not training time (`seconds` and the rates leave it out).
    """
    model.to(spec.device).train()
    optimizer = optimizer_for(model, spec)
    losses: list[float] = []
    examples = units = step = 0
    start = time.perf_counter()
    bar = tqdm(
        total=spec.steps,
        desc=desc,
        unit="step",
        dynamic_ncols=True,
        mininterval=2.0,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
    )
    ema = None
    averager = _Averager(model, spec.steps - spec.average_last) if spec.average_last > 0 else None
    probe_at = set(probe.steps(spec.steps, probe_points)) if probe is not None else set()
    curve: list[tuple[int, float]] = []
    probe_s = 0.0
    while step < spec.steps:
        elapsed = time.perf_counter() - start - probe_s
        if spec.deadline_s is not None and step > 0 and elapsed >= spec.deadline_s:  # at least one step
            log.warning(
                "%s: the --max-minutes guard stopped training after %d of %d steps (%.0f s): "
                "this model is UNDER-TRAINED and its manifest says so",
                desc,
                step,
                spec.steps,
                elapsed,
            )
            break
        lr = spec.learning_rate(step)
        value, n_examples, n_units = train_step(model, optimizer, next(batches), loss_fn, spec, lr)
        step += 1
        examples += n_examples
        units += n_units
        losses.append(value)
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        if averager is not None:
            averager.update(step, last=step == spec.steps)
        if probe is not None and step in probe_at:
            probe_start = time.perf_counter()
            curve.append((step, _measure(model, probe)))
            probe_s += time.perf_counter() - probe_start
        shown = {probe.metric: f"{curve[-1][1]:.4g}"} if probe is not None and curve else {}
        bar.set_postfix(
            loss=f"{ema:.3f}",
            lr=f"{lr:.1e}",
            **{f"{unit}/s": f"{units / max(time.perf_counter() - start - probe_s, 1e-9):.0f}"},
            **shown,
            refresh=False,
        )
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start - probe_s
    model.cpu().eval()  # export and checkpoints work on CPU tensors
    tail = losses[-50:] or [float("nan")]
    result = TrainResult(step, spec.steps, seconds, examples, units, unit, float(np.mean(tail)), losses)
    if probe is not None and curve:
        result.curve = curve
        result.probe = {
            "metric": probe.metric,
            "examples": probe.examples,
            "target": probe.target,
            "seconds": round(probe_s, 1),
        }
        log.info(
            "%s: %s on %s by step: %s",
            desc,
            probe.metric,
            probe.examples,
            ", ".join(f"{s}: {v:.4g}" for s, v in curve),
        )
    if curve_path is not None and losses:  # a model trained no further (the embedder) has no curve
        save_curve(losses, curve_path, desc)
        if curve:
            save_validation_curve(curve, curve_path.with_name("validation_curve.png"), desc, probe)
    return result


class _Averager:
    """The running mean of a model's weights after each step past ``start``, put into the model at the end."""

    def __init__(self, model: nn.Module, start: int) -> None:
        self.params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        self.start = max(0, start)
        self.mean: list[torch.Tensor] = []
        self.count = 0

    @torch.no_grad()
    def update(self, step: int, last: bool) -> None:
        if step <= self.start:
            return
        self.count += 1
        if not self.mean:
            self.mean = [p.detach().clone() for p in self.params]
        else:
            torch._foreach_lerp_(self.mean, [p.detach() for p in self.params], 1.0 / self.count)
        if last:
            torch._foreach_copy_(self.params, self.mean)


def _measure(model: nn.Module, probe: Probe) -> float:
    """The probe on the model in eval mode, leaving its mode and the global RNG as they were."""
    model.eval()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        value = float(probe.measure(model))
    model.train()
    return value


def to_device(batch: Any, device: str) -> Any:
    if device == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


def save_curve(losses: list[float], path: Path, title: str) -> None:
    """Loss per step (light) and its moving average (dark), as a PNG beside the model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, alpha=0.3, linewidth=0.8, label="loss")
    if len(losses) >= 10:
        window = max(5, len(losses) // 50)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, linewidth=1.8, label=f"moving average ({window} steps)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save_validation_curve(
    curve: list[tuple[int, float]], path: Path, title: str, probe: Probe | None
) -> None:
    """The validation metric at the probed steps (and its target, where there is one), as a PNG."""
    assert probe is not None
    draw_validation_curve(curve, path, title, probe.metric, probe.examples, probe.target)


def draw_validation_curve(
    curve: list[tuple[int, float]],
    path: Path,
    title: str,
    metric: str,
    examples: str,
    target: float | None,
    final: tuple[int, float] | None = None,
    budget: int | None = None,
) -> None:
    """The probed points; `final` is the build's ONNX evaluation on the whole split, marked apart.

    `budget`, where given, is the profile's step budget, drawn as a vertical line on a run that
    trained for more (or fewer) steps than it.

    The probes score a subset, which can be easier or harder than the whole split the target is
    set on: the final point says where the model really stands against the target line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps, values = zip(*curve, strict=True)
    ax.plot(steps, values, marker="o", linewidth=1.8, label=f"{metric} on {examples} (torch, in training)")
    for s, v in curve:
        ax.annotate(f"{v:.3g}", (s, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    if final is not None:
        ax.plot(
            *final,
            marker="*",
            markersize=13,
            linestyle="none",
            color="tab:green",
            label="the whole validation split (the exported ONNX graph)",
        )
        ax.annotate(
            f"{final[1]:.3g}",
            final,
            textcoords="offset points",
            xytext=(0, -14),
            ha="center",
            fontsize=8,
            color="tab:green",
        )
    if target is not None:
        ax.axhline(
            target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target:g} (whole split)"
        )
    if budget is not None:
        ax.axvline(
            budget,
            color="tab:gray",
            linestyle=":",
            linewidth=1.2,
            label=f"the profile's budget ({budget} steps)",
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(metric)
    ax.set_title(f"{title}: {metric} against steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def infinite(make_epoch: Callable[[int], Iterator[Any]]) -> Iterator[Any]:
    """Cycle over epochs forever; `make_epoch(epoch)` reshuffles with an epoch-dependent seed."""
    epoch = 0
    while True:
        yield from make_epoch(epoch)
        epoch += 1
