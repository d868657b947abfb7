"""One training loop for every model: AdamW with warmup, a time budget, a progress bar and a loss curve.

The schedule decays by whichever runs out first, steps or the time budget,
so a model given 5 minutes ends its run at a low learning rate instead of
being cut off mid-schedule.
"""

from __future__ import annotations

import logging
import math
import os
import random
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


@dataclass
class TrainSpec:
    max_steps: int
    time_budget_s: float
    lr: float
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    min_lr_ratio: float = 0.05
    device: str = "cpu"


@dataclass
class TrainResult:
    steps: int
    seconds: float
    examples: int
    units: int
    unit: str
    final_loss: float
    losses: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "examples_seen": self.examples,
            f"{self.unit}_per_second": round(self.units / max(self.seconds, 1e-9), 1),
            "final_loss": round(self.final_loss, 4),
        }


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configure_threads() -> None:
    torch.set_num_threads(int(os.environ.get("TORCH_NUM_THREADS", os.cpu_count() or 1)))


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases, norms and embeddings-as-vectors (the usual AdamW practice)."""
    decay, no_decay, seen = [], [], set()
    for _name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(
    model: nn.Module,
    batches: Iterator[Any],
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int, int]],
    spec: TrainSpec,
    desc: str,
    unit: str = "tokens",
    curve_path: Path | None = None,
) -> TrainResult:
    """Train until `max_steps` or `time_budget_s`, whichever comes first.

    `loss_fn(model, batch)` returns (loss, examples in the batch, units in the
    batch) where units are what throughput is counted in (tokens, images).
    """
    model.to(spec.device).train()
    optimizer = torch.optim.AdamW(
        _param_groups(model, spec.weight_decay), lr=spec.lr, betas=(0.9, 0.98), eps=1e-8
    )
    losses: list[float] = []
    examples = units = step = 0
    start = time.perf_counter()
    # The bar counts progress in thousandths of whichever limit binds first (steps or time budget),
    # so its ETA is the real time left.
    bar = tqdm(
        total=1000,
        desc=desc,
        unit="‰",
        dynamic_ncols=True,
        mininterval=2.0,
        bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]",
    )
    ema = None
    while step < spec.max_steps:
        elapsed = time.perf_counter() - start
        if elapsed >= spec.time_budget_s:
            log.info("%s: time budget of %.0fs reached after %d steps", desc, spec.time_budget_s, step)
            break
        progress = max(step / spec.max_steps, elapsed / spec.time_budget_s)
        # Warmup ends after warmup_steps or 5% of the time budget, whichever comes first: on a slow
        # machine a time-limited run may only make a few hundred steps in all.
        lr = spec.lr * min(
            1.0, max((step + 1) / max(1, spec.warmup_steps), elapsed / (0.05 * spec.time_budget_s))
        )
        lr *= spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr

        loss, n_examples, n_units = loss_fn(model, to_device(next(batches), spec.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if spec.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optimizer.step()

        step += 1
        examples += n_examples
        units += n_units
        value = float(loss.detach())
        losses.append(value)
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        elapsed = time.perf_counter() - start
        done = int(1000 * min(1.0, max(step / spec.max_steps, elapsed / spec.time_budget_s)))
        bar.set_postfix(
            step=step,
            loss=f"{ema:.3f}",
            lr=f"{lr:.1e}",
            **{f"{unit}/s": f"{units / elapsed:.0f}"},
            refresh=False,
        )
        bar.update(done - bar.n)
    bar.close()
    seconds = time.perf_counter() - start
    model.cpu().eval()  # export and checkpoints work on CPU tensors
    tail = losses[-50:] or [float("nan")]
    result = TrainResult(step, seconds, examples, units, unit, float(np.mean(tail)), losses)
    if curve_path is not None:
        save_curve(losses, curve_path, desc)
    return result


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


def infinite(make_epoch: Callable[[int], Iterator[Any]]) -> Iterator[Any]:
    """Cycle over epochs forever; `make_epoch(epoch)` reshuffles with an epoch-dependent seed."""
    epoch = 0
    while True:
        yield from make_epoch(epoch)
        epoch += 1
