"""(f) Cold start: spawning ``python -m service`` -> /health/ready answering 200 with every model loaded.

The whole repository is served, with the service's defaults (hash checks, warm-up of every model).
The clock starts just before the process is spawned and stops at the first 200 from /health/ready
(polled every 20 ms); /v1/models must then list every model folder and refuse none. The service's own
log lines give a breakdown: interpreter and imports until the first model starts loading, loading
(manifest, hashes, ONNX Runtime sessions) per model, and warm-up per model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/cold_start.py` anywhere

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import model_folders
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server, providers
from harness.stats import median

NAME = "cold_start"
TITLE = "(f) Cold start: process spawn to /health/ready 200, all models loaded"
TARGET_S = 10.0

# Whatever the log format, a line holds a logging timestamp (local time) and one of these messages.
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_LOADED = re.compile(r"\bloaded (\S+) \(")
_WARMED = re.compile(r"\bwarmed up (\S+) in ([\d.]+)s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=None, help="cold starts (default 3, quick 1)")


def breakdown(log: str, spawned_wall: float) -> dict[str, Any]:
    """Per-model load finish times (s after spawn) and warm-up durations, from the service's log."""
    loaded: dict[str, float] = {}
    warmed: dict[str, float] = {}
    for line in log.splitlines():
        match = _STAMP.search(line)
        if not match:
            continue
        stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if m := _LOADED.search(line):
            loaded[m.group(1)] = stamp - spawned_wall
        elif m := _WARMED.search(line):
            warmed[m.group(1)] = float(m.group(2))
    return {"loaded_at": loaded, "warmup_s": warmed}


def run(opts: Options) -> Result:
    folders = model_folders(opts.models)
    runs = opts.extra.get("runs") or (1 if opts.quick else 3)
    times: list[float] = []
    parts: list[dict[str, Any]] = []
    provider = "unknown"
    problems: list[str] = []
    for _ in range(runs):
        server = benchmark_server(opts.models, opts, log_level="info")
        spawned_wall = time.time()
        try:
            server.start()
            times.append(server.ready_s)
            listing = server.get_json("/v1/models")
            served = {m["name"] for m in listing.get("data", [])}
            missing = sorted({f.name for f in folders} - served)
            refused = [r.get("name") for r in listing.get("refused", [])]
            if missing or refused:
                problems.append(f"not served: {missing}, refused: {refused}")
            provider = providers(server)
            server.stop()
            parts.append(breakdown(server.log(), spawned_wall))
        finally:
            server.close()

    seconds = median(times)
    metrics: dict[str, object] = {
        "cold_start_seconds": seconds,
        "cold_start_min_s": min(times),
        "cold_start_max_s": max(times),
        "models": len(folders),
        "runs": runs,
    }
    last = parts[-1] if parts else {"loaded_at": {}, "warmup_s": {}}
    loaded_at, warmup = last["loaded_at"], last["warmup_s"]
    details = [
        "| run | spawn -> ready (s) |",
        "|---|---|",
        *(f"| {i + 1} | {t:.2f} |" for i, t in enumerate(times)),
        "",
        f"{len(folders)} models ({', '.join(f.name for f in folders)}), hash checks and warm-up on (service "
        f"defaults); median of {runs} run(s): **{seconds:.2f} s**."
        + (f" **Problems: {'; '.join(problems)}.**" if problems else " Every model loaded, none refused."),
    ]
    if loaded_at:
        order = sorted(loaded_at.items(), key=lambda kv: kv[1])
        first = order[0][1]
        rows = ["", "Breakdown of the last run, from the service's log (s after spawn):", ""]
        rows += ["| model | loaded at | load (s) | warm-up (s) |", "|---|---|---|---|"]
        previous = None
        for name, at in order:
            load = "" if previous is None else f"{at - previous:.2f}"
            rows.append(f"| {name} | {at:.2f} | {load} | {warmup.get(name, float('nan')):.2f} |")
            previous = at
        total_warm = sum(warmup.values())
        rows.append(
            f"\nThe first model finished loading {first:.2f} s after spawn (interpreter, imports, that model's "
            f"load); all were loaded at {order[-1][1]:.2f} s; warm-ups took {total_warm:.2f} s in all."
        )
        details += rows
        metrics["breakdown"] = {"loaded_at_s": loaded_at, "warmup_s": warmup}
    checks = [Check("Cold start (s)", seconds, TARGET_S, higher_is_better=False, unit=" s")]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
