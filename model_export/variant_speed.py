"""How much faster one variant's graphs run than another's on this machine, at the service's shapes.

Int8 pays where its integer GEMM saves more than quantizing each row costs: on a 2-core AVX2 EPYC
(no VNNI), bert-classifier's 384 x 1536 matmuls ran 1.3x faster in int8 at batch 32, but GPT's
192 x 768 ones no faster, and a 16-row decoding step 0.87x (the quantization's small ops cost more
than the integer GEMM saves). So ``variants.py`` serves int8 by default only where this measures it
faster than the fused graphs, on the machine that builds.

What is timed, per task: a decoder (GPT, the translator's decoder) runs one decoding step of
``ROWS`` sequences over a past of ``PAST`` tokens, what generation spends its time on (its in-place
step graph, as the service decodes on CPU, where both sides have one); every other
graph runs a batch of ``ROWS`` inputs of ``LENGTH`` tokens (ViT: ``ROWS`` images). Both sides run in
turns, ``ROUNDS`` times, each for about ``SECONDS``; the figure is the median of the rounds' ratios.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROWS, LENGTH, PAST = 16, 48, 32
ROUNDS, SECONDS = 5, 0.25
DECODER_GRAPHS = {"text-generation": "model", "translation": "decoder"}  # task -> its decoding graph


def _feeds(session: Any, step: bool) -> dict[str, np.ndarray]:
    """Random inputs of the timed shapes; ``step``: one new token per row over a past of PAST."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else (ROWS if i == 0 else LENGTH) for i, d in enumerate(spec.shape)]
        name = spec.name
        if name.startswith("past_"):
            shape[2] = PAST if step else 0
        elif step and name in ("input_ids", "position_ids"):
            shape = [ROWS, 1]
        elif step and name == "attention_mask":
            shape = [ROWS, PAST + 1]
        if spec.type == "tensor(int64)":
            if "mask" in name:
                feeds[name] = np.ones(shape, np.int64)
            elif "position" in name:
                first = PAST if step else 0
                feeds[name] = np.tile(np.arange(first, first + shape[1], dtype=np.int64), (shape[0], 1))
            elif "token_type" in name:
                feeds[name] = np.zeros(shape, np.int64)
            else:
                feeds[name] = rng.integers(5, 100, shape, dtype=np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _inplace_step(session: Any) -> Callable[[], None]:
    """One decoding step of the in-place graph, its past and present bound to the same buffers."""
    rng = np.random.default_rng(0)
    capacity = PAST + 16
    binding = session.io_binding()
    keep: list[np.ndarray] = []  # the bound arrays must outlive the binding
    for spec in session.get_inputs():
        name = spec.name
        if name.startswith("past_"):
            shape = [
                ROWS if i == 0 else capacity if not isinstance(d, int) else d
                for i, d in enumerate(spec.shape)
            ]
            buffer = np.zeros(shape, np.float32)
            keep.append(buffer)
            binding.bind_input(name, "cpu", 0, np.float32, shape, buffer.ctypes.data)
            binding.bind_output(
                name.replace("past_", "present_", 1), "cpu", 0, np.float32, shape, buffer.ctypes.data
            )
            continue
        if name in ("input_ids", "position_ids"):
            value = np.full((ROWS, 1), PAST if name == "position_ids" else 7, np.int64)
        elif name == "seqlens_k":
            value = np.full((ROWS,), PAST, np.int32)
        elif name == "total_sequence_length":
            value = np.array(PAST + 1, np.int32)
        else:
            shape = [
                d if isinstance(d, int) else (ROWS if i == 0 else LENGTH) for i, d in enumerate(spec.shape)
            ]
            if spec.type == "tensor(int64)":
                value = np.ones(shape, np.int64)
            else:
                value = rng.standard_normal(shape).astype(np.float32)
        keep.append(value)
        binding.bind_cpu_input(name, value)
    for out in session.get_outputs():
        if not out.name.startswith("present_"):
            binding.bind_output(out.name, "cpu")

    def step() -> None:
        session.run_with_iobinding(binding)
        assert keep  # held by the closure

    return step


def speedup(
    folder: Path,
    task: str,
    baseline: dict[str, str],
    variant: dict[str, str],
    baseline_steps: dict[str, str] | None = None,
    variant_steps: dict[str, str] | None = None,
) -> float:
    """Median over rounds of (baseline's time / variant's time) on the same inputs; > 1: variant faster.

    A decoder is timed on its in-place step graph where both sides have one (``*_steps``: graph name ->
    file, what the service decodes with on CPU), else on its Concat graph.
    """
    import onnxruntime as ort

    step = task in DECODER_GRAPHS
    graphs = [DECODER_GRAPHS[task]] if step else list(baseline)
    inplace = step and bool(baseline_steps) and bool(variant_steps)
    runs: dict[str, list[Callable[[], Any]]] = {}
    for side, files, steps in (("baseline", baseline, baseline_steps), ("variant", variant, variant_steps)):
        runs[side] = []
        for graph in graphs:
            path = folder / (steps[graph] if inplace and steps else files[graph])
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            if inplace:
                work = _inplace_step(session)
            else:
                feeds = _feeds(session, step=step)
                work = functools.partial(session.run, None, feeds)
            work()  # warm-up: first-run allocations
            runs[side].append(work)

    def once(side: str) -> float:
        start = time.perf_counter()
        for work in runs[side]:
            work()
        return time.perf_counter() - start

    per_round = max(1, int(SECONDS / max(once("baseline"), 1e-6)))
    ratios = []
    for _ in range(ROUNDS):
        base = sum(once("baseline") for _ in range(per_round))
        new = sum(once("variant") for _ in range(per_round))
        ratios.append(base / new)
    return round(statistics.median(ratios), 3)
