"""How long a build will take on this machine, from a short measured warm-up, printed before training starts.

Each model's job runs a few optimizer steps on a copy of its model; the
seconds per step times the step budget is its training time. Export and
evaluation, and the variants stage (fused / int8 / fp16 graphs, each checked
and evaluated), were timed once on the reference machine (the recipe's
`reference_*` figures) and are scaled by how much slower or faster this
machine's steps are than the reference's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .recipes.common import TrainingJob

log = logging.getLogger(__name__)


@dataclass
class ModelEstimate:
    name: str
    steps: int
    seconds_per_step: float
    speed_vs_reference: float | None  # reference seconds per step / ours: 0.5 = half as fast
    other_s: float  # export and evaluation
    variants_s: float = 0.0  # the variants stage

    @property
    def train_s(self) -> float:
        return self.steps * self.seconds_per_step

    @property
    def total_s(self) -> float:
        return self.train_s + self.other_s + self.variants_s


def estimate(jobs: Sequence[TrainingJob], export_and_evaluate: bool, variants: bool) -> list[ModelEstimate]:
    estimates = []
    for job in jobs:
        seconds = job.seconds_per_step() if job.spec.steps else 0.0  # nothing to train, nothing to time
        recipe = job.ctx.recipe
        reference = recipe.reference_step_s
        speed = reference / seconds if reference else None
        other = float(recipe.reference_other_s) if export_and_evaluate else 0.0
        variants_s = float(recipe.reference_variants_s) if export_and_evaluate and variants else 0.0
        if speed is not None:
            other /= speed
            variants_s /= speed
        estimates.append(ModelEstimate(job.ctx.name, job.spec.steps, seconds, speed, other, variants_s))
        log.info("%s: warm-up %.3f s/step", job.ctx.name, seconds)
    return estimates


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def report(estimates: Sequence[ModelEstimate], cpu: str, threads: int, max_minutes: float | None) -> str:
    """The table printed before training: per model steps, speed and time; the total; the guard."""
    lines = [
        f"Build estimate on this machine ({cpu}, {threads} torch threads), from a measured warm-up:",
        f"  {'model':<16}{'steps':>7}{'s/step':>9}{'vs ref':>8}{'train':>11}{'export+eval':>13}{'variants':>10}",
    ]
    for e in estimates:
        speed = f"{e.speed_vs_reference:.2f}x" if e.speed_vs_reference else "-"
        lines.append(
            f"  {e.name:<16}{e.steps:>7}{e.seconds_per_step:>9.3f}{speed:>8}"
            f"{_minutes(e.train_s):>11}{_minutes(e.other_s):>13}{_minutes(e.variants_s):>10}"
        )
    total = sum(e.total_s for e in estimates)
    lines.append(f"  total: about {_minutes(total)} (a busy machine takes longer and builds the same models)")
    if max_minutes is not None and total > 60 * max_minutes:
        lines.append(
            f"  WARNING: --max-minutes {max_minutes:g} is shorter than the estimate: models will stop "
            "early and be marked under-trained in their manifests"
        )
    return "\n".join(lines)


def deadline_share(remaining_s: float, current: ModelEstimate, later: Sequence[ModelEstimate]) -> float:
    """The --max-minutes guard's training seconds for `current`: the time left, split by estimate.

    The model about to train gets the fraction of the remaining time that its
    training is of everything still to do (its own export and evaluation and
    every later model included), so a slow early model cannot starve the rest.
    """
    still_to_do = current.total_s + sum(e.total_s for e in later)
    return max(0.0, remaining_s * current.train_s / max(still_to_do, 1e-9))
