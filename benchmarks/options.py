"""What every benchmark runs with: the options a script takes, and where things are by default."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
DEFAULT_MODELS = ROOT / "models"
DEFAULT_RESULTS = BENCH_DIR / "RESULTS.md"
PYTHON = sys.executable

# ONNX Runtime threads per operator, for the served model and for in-process runs alike: 0 is ONNX
# Runtime's (and the service's) default, one per core. The load generator shares the cores but costs
# at most ~0.1 core (the tables report it), so the server gets them all, as it would in production;
# its event loop then competes with ONNX Runtime's threads, which is part of what the overhead
# benchmark measures. With 1 thread on 2 cores the event loop gets a core to itself but half the
# compute sits idle (measured: served/raw 0.89 instead of 0.83, at 0.57x the throughput).
DEFAULT_THREADS = 0

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


@dataclass
class Options:
    models: Path = DEFAULT_MODELS
    quick: bool = False
    threads: int = DEFAULT_THREADS
    device: str = "auto"
    results: Path | None = DEFAULT_RESULTS  # None: do not record
    out_dir: Path = BENCH_DIR  # where plots go
    extra: dict[str, Any] = field(default_factory=dict)  # a benchmark's own options


def describe_options(opts: Options) -> dict[str, Any]:
    return {
        "models": str(opts.models),
        "quick": opts.quick,
        "intra_op_threads": opts.threads,
        "device": opts.device,
    }
