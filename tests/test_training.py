"""Training itself: step budgets, reproducible weights, and a translator that must use its source.

These run the real CLI (`python -m model_export`) on the tiny profile, so the
whole path is covered: data loading, tokenizer training, the step-budgeted
loop, export to ONNX and evaluation through ONNX Runtime with the service's
own decoding.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model_export.recipes.common import Trained
from model_export.training import Probe, TrainResult, TrainSpec, train

pytestmark = pytest.mark.slow  # trains models for real: not in the fast layer

ROOT = Path(__file__).resolve().parents[1]


def build(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCH_NUM_THREADS": "2", "ORT_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "model_export", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_learning_rate_is_a_function_of_the_step_alone() -> None:
    spec = TrainSpec(steps=1000, lr=1e-3, warmup_steps=100, min_lr_ratio=0.05)
    assert spec.learning_rate(0) == pytest.approx(1e-5)  # warmup starts at lr / warmup_steps
    assert spec.learning_rate(99) == pytest.approx(
        1e-3 * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * 0.099)))
    )
    rates = [spec.learning_rate(step) for step in range(100, 1000)]
    assert all(a >= b for a, b in itertools.pairwise(rates))  # decays monotonically after warmup
    assert spec.learning_rate(1000) == pytest.approx(5e-5)  # ends at min_lr_ratio, on the last step


def test_probes_measure_without_changing_what_is_trained() -> None:
    """A probe runs in eval mode on its own RNG stream: the weights equal a run without it."""

    def run(probe: Probe | None) -> tuple[TrainResult, torch.nn.Module]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
        generator = torch.Generator().manual_seed(1)

        def batches():  # type: ignore[no-untyped-def]
            while True:
                yield torch.randn(16, 4, generator=generator)

        def loss_fn(m, x):  # type: ignore[no-untyped-def]
            return (m(x) - x.sum(1, keepdim=True)).pow(2).mean(), len(x), len(x)

        spec = TrainSpec(steps=30, lr=1e-2, warmup_steps=3)
        return train(model, batches(), loss_fn, spec, "probe", "rows", None, probe, 3), model

    seen_modes: list[bool] = []

    def measure(m: torch.nn.Module) -> float:
        seen_modes.append(m.training)
        torch.rand(100)  # a probe that draws from the global RNG must not shift the run's dropout
        return float(m(torch.ones(1, 4)).item())

    probed, a = run(Probe("output", measure, "one input"))
    plain, b = run(None)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert [s for s, _ in probed.curve] == [10, 20, 30] and seen_modes == [False] * 3
    assert probed.curve[-1][1] == pytest.approx(float(b.eval()(torch.ones(1, 4)).item()))
    assert plain.curve == [] and "validation_curve" not in plain.summary()
    assert probed.summary()["validation_curve"]["points"][0][0] == 10


def test_checkpoint_averaging_ends_on_the_mean_of_the_last_steps_weights() -> None:
    """``average_last=k``: the model ends as the mean of its weights after each of the last k steps,
    and the last probe measures that model (the one exported)."""

    def run(average_last: int, snapshots: list[list[torch.Tensor]]) -> tuple[TrainResult, torch.nn.Module]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        generator = torch.Generator().manual_seed(1)

        def batches():  # type: ignore[no-untyped-def]
            while True:
                yield torch.randn(16, 4, generator=generator)

        def loss_fn(m, x):  # type: ignore[no-untyped-def]
            snapshots.append([p.detach().clone() for p in m.parameters()])  # the weights after the last step
            return (m(x) - x.sum(1, keepdim=True)).pow(2).mean(), len(x), len(x)

        spec = TrainSpec(steps=20, lr=1e-2, warmup_steps=2, average_last=average_last)
        probe = Probe("output", lambda m: float(m(torch.ones(1, 4)).item()), "one input")
        return train(model, batches(), loss_fn, spec, "average", "rows", None, probe, 1), model

    plain_seen: list[list[torch.Tensor]] = []
    plain_result, plain = run(0, plain_seen)
    averaged_seen: list[list[torch.Tensor]] = []
    averaged_result, averaged = run(5, averaged_seen)
    after = [[p.detach() for p in plain.parameters()]]
    # loss_fn of step s sees the weights after step s - 1: steps 16..20's weights are snapshots 16..19 and the end
    last_five = plain_seen[16:] + after
    assert all(  # averaging only reads the weights until the end: the same run up to its last step
        torch.equal(x, y)
        for a, b in zip(plain_seen, averaged_seen, strict=True)
        for x, y in zip(a, b, strict=True)
    )
    for got, *steps in zip(averaged.parameters(), *last_five, strict=True):
        expected = torch.stack(steps).mean(0)
        assert torch.allclose(got, expected, atol=1e-6)
        assert not torch.allclose(got, steps[-1], atol=1e-4)  # really averaged, not the last step's
    assert averaged_result.curve[-1][1] == pytest.approx(float(averaged(torch.ones(1, 4)).item()))
    assert plain_result.curve[-1][1] != pytest.approx(averaged_result.curve[-1][1])


def state(path: Path) -> dict[str, torch.Tensor]:
    return Trained.load(path).model.state_dict()


def test_same_seed_same_data_same_threads_same_weights(tmp_path: Path, data_dir: Path) -> None:
    """Two builds, one of them sharing its run with another model: bit-identical weights and manifests' steps."""
    common = ["train", "--profile", "tiny", "--data-dir", str(data_dir), "--seed", "3"]
    first = build(*common, "--models", "translator,gpt", "--out", str(tmp_path / "a"))
    build(*common, "--models", "gpt", "--out", str(tmp_path / "b"))
    build(*common, "--models", "translator", "--out", str(tmp_path / "b"))
    assert "Build estimate on this machine" in first.stderr and "total: about" in first.stderr
    for name in ("translator", "gpt"):
        a = state(tmp_path / "a" / ".work" / name / "trained.pt")
        b = state(tmp_path / "b" / ".work" / name / "trained.pt")
        assert a.keys() == b.keys()
        different = [k for k in a if not torch.equal(a[k], b[k])]
        assert not different, f"{name}: {different[:5]} differ between two builds with the same seed"
    # A different seed gives different weights: the comparison above can fail.
    build(*common[:-1], "4", "--models", "gpt", "--out", str(tmp_path / "c"))
    c = state(tmp_path / "c" / ".work" / "gpt" / "trained.pt")
    a = state(tmp_path / "a" / ".work" / "gpt" / "trained.pt")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_manifest_records_steps_seed_versions_and_machine(tiny_models: Path) -> None:
    manifest = json.loads((tiny_models / "gpt" / "manifest.json").read_text())
    training = manifest["training"]
    assert training["steps"] == training["planned_steps"] > 0 and training["under_trained"] is False
    assert isinstance(training["seed"], int)
    machine = training["machine"]
    assert machine["cpu"] and isinstance(machine["avx512"], bool) and machine["torch_threads"] >= 1
    assert {"torch", "numpy", "tokenizers", "onnx"} <= set(machine["libraries"])


def test_max_minutes_guard_stops_early_and_marks_the_model_under_trained(
    tmp_path: Path, data_dir: Path
) -> None:
    result = build(
        "all",
        "--profile",
        "tiny",
        "--models",
        "vit",
        "--data-dir",
        str(data_dir),
        "--out",
        str(tmp_path),
        "--steps",
        "vit=100000",
        "--max-minutes",
        "0.05",
    )
    assert "shorter than the estimate" in result.stderr
    assert "UNDER-TRAINED" in result.stderr
    training = json.loads((tmp_path / "vit" / "manifest.json").read_text())["training"]
    assert training["under_trained"] is True and 0 < training["steps"] < training["planned_steps"] == 100000


def write_copy_task(root: Path, seed: int = 0) -> None:
    """multi30k laid out as usual, but each 'translation' is its source: digit strings copied."""
    rng = random.Random(seed)

    def digits() -> str:
        return " ".join(rng.choice("0123456789") for _ in range(rng.randint(4, 10)))

    train = [digits() for _ in range(2000)]
    seen = set(train)
    validation: list[str] = []
    while len(validation) < 64:
        candidate = digits()
        if candidate not in seen:  # unseen strings: only copying the source can get them right
            validation.append(candidate)
            seen.add(candidate)
    folder = root / "multi30k"
    folder.mkdir(parents=True)
    for split, rows in (("train", train), ("validation", validation)):
        for language in ("en", "de"):
            with gzip.open(folder / f"{split}.{language}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(rows) + "\n")


def test_tiny_translator_learns_to_copy_unseen_digit_strings(tmp_path: Path) -> None:
    """A decoder that ignores its source (a fluent language model of digits) scores near BLEU 0 here."""
    data = tmp_path / "data"
    write_copy_task(data)
    out = tmp_path / "models"
    build(
        "all",
        "--profile",
        "tiny",
        "--models",
        "translator",
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--steps",
        "translator=600",
        "--probe-points",
        "3",
    )
    # --probe-points sets the curve's resolution: three evenly spaced probes, the last at the last step
    curve = json.loads((out / "translator" / "manifest.json").read_text())["training"]["validation_curve"]
    assert [step for step, _ in curve["points"]] == [200, 400, 600]
    scores = json.loads((out / "evaluation.json").read_text())["translator"]
    assert scores["bleu"] >= 90 and scores["chrf"] >= 90, scores
    for sample in scores["samples"]:
        assert sample["hypothesis"] == sample["source"], sample
