"""The benchmarks run: every one in --quick mode against the tiny models, through run_all.py.

Smoke test only: the figures of a --quick run on tiny models mean nothing, so nothing here asserts a
timing or a ratio; only that each headline key is written as a positive number, that the results
table and the plot are written, and that every script fails clearly without a model repository.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "kv_cache",
    "batching",
    "overhead",
    "continuous_batching",
    "response_cache",
    "cold_start",
    "protocols",
    "variants",
    "run_all",
]
HEADLINE = [
    "kv_cache_speedup_256",
    "batching_speedup_32",
    "served_over_raw",
    "continuous_batching_speedup_16",
    "cache_hit_speedup_generate",
    "cold_start_seconds",
    "openai_over_native_generate",
    "oip_binary_over_native_classify",
    "int8_classify_speedup_32",
]


def test_run_all_quick_writes_every_headline_figure(tiny_models: Path, tmp_path: Path) -> None:
    out, results = tmp_path / "figures.json", tmp_path / "RESULTS.md"
    cmd = [
        sys.executable,
        "benchmarks/run_all.py",
        "--quick",
        "--models",
        str(tiny_models),
        "--json",
        str(out),
        "--results",
        str(results),
        "--out-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    figures = json.loads(out.read_text())
    for key in HEADLINE:
        value = figures.get(key)
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{key}: {value!r}"
        assert math.isfinite(value) and value > 0, f"{key}: {value!r}"
    assert not figures["failures"]
    table = results.read_text()
    assert "| figure | measured | target | verdict |" in table
    assert table.count("PASS") + table.count("MISS") >= len(HEADLINE)
    assert (tmp_path / "kv_cache_latency.png").stat().st_size > 1000


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_without_a_repository_says_so(script: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-models-here"
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}.py", "--models", str(missing), "--no-record"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"model repository {missing} does not exist" in proc.stderr
