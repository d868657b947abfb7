"""Every benchmark, one after the other, within about 18 minutes on a 2-core machine.

    python benchmarks/run_all.py --json benchmarks/latest.json [--models DIR] [--quick] [--only NAME ...]
        [--peers-python .venv-peers/bin/python] [--triton-python .venv-triton/bin/python]
        [--mlserver-python .venv-mlserver/bin/python]

Prints each ratio with its target and PASS/MISS, appends one dated section to benchmarks/RESULTS.md
and writes the headline figures under fixed keys (HEADLINE) to the JSON file, with each benchmark's
full figures under "details". A benchmark that fails is reported and the others still run; the exit
status is then 1. An optional benchmark that cannot run with the options given (``peers.py`` without
``--peers-python``: the peer servers live in a venv of their own) is skipped, saying why.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/run_all.py` anywhere

from benchmarks import (
    batching,
    cold_start,
    continuous_batching,
    generation_features,
    kv_cache,
    model_loads,
    overhead,
    peers,
    priority,
    protocols,
    response_cache,
    served_variants,
    tracing,
    variants,
)
from benchmarks.cli import base_parser, options_from, timed_run
from benchmarks.options import describe_options
from benchmarks.repository import fail_without_repository
from benchmarks.results import Result, append_results, machine_info, print_result
from harness.json_file import write_json

MODULES: list[ModuleType] = [
    kv_cache,
    batching,
    overhead,
    continuous_batching,
    response_cache,
    cold_start,
    protocols,
    variants,
    served_variants,
    model_loads,
    priority,
    tracing,
    generation_features,
    peers,  # optional: needs --peers-python
]

# The JSON keys every run writes, and the benchmark each comes from.
HEADLINE = {
    "kv_cache_speedup_256": "kv_cache",
    "batching_speedup_32": "batching",
    "served_over_raw": "overhead",
    "continuous_batching_speedup_16": "continuous_batching",
    "cache_hit_speedup_generate": "response_cache",
    "cold_start_seconds": "cold_start",
    "openai_over_native_generate": "protocols",
    "oip_binary_over_native_classify": "protocols",
    "int8_classify_speedup_32": "variants",
    "int8_served_classify_speedup_32": "served_variants",
    "inplace_kv_step_speedup_16": "kv_cache",
    "litserve_over_service_32": "peers",
    "ray_serve_over_service_32": "peers",
    "reload_p99_over_steady_32": "model_loads",
    "priority_high_p99_overload_over_idle": "priority",
    "priority_high_p99_2x_over_idle": "priority",
    "traced_over_untraced_32": "tracing",
    "masked_step_speed": "generation_features",
    "prefix_cache_ttft_speedup": "generation_features",
    "ngram_speculation_speedup": "generation_features",
}
BUDGET_S = 18 * 60


def parse() -> argparse.Namespace:
    parser = base_parser("Run every benchmark and write the headline figures")
    names = [m.NAME for m in MODULES]
    parser.add_argument("--only", nargs="+", choices=names, help="run only these benchmarks")
    parser.add_argument(
        "--peers-python",
        type=Path,
        default=None,
        help=f"python of the peer servers' venv, for peers.py (make it: {peers.VENV_HINT}); without it: skipped",
    )
    for venv in ("triton", "mlserver"):
        parser.add_argument(
            f"--{venv}-python",
            type=Path,
            default=None,
            help=f"python of {venv}'s venv, for peers.py (make it: {peers.venv_hint(venv)}); without it: left out",
        )
    return parser.parse_args()


def main() -> int:
    args = parse()
    opts = options_from(args)
    # otherwise each benchmark with its own defaults
    opts.extra = {f"{venv}_python": getattr(args, f"{venv}_python") for venv in peers.VENVS}
    fail_without_repository(opts.models)
    started = time.perf_counter()
    results: list[Result] = []
    failures: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for module in MODULES:
        if args.only and module.NAME not in args.only:
            continue
        print(f"\n-> {module.TITLE}", flush=True)
        reason = module.skip_reason(opts) if hasattr(module, "skip_reason") else None
        if reason is not None:
            print(f"skipped: {reason}", flush=True)
            skipped[module.NAME] = reason
            continue
        try:
            result = timed_run(module, opts)
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failures[module.NAME] = f"{type(exc).__name__}: {exc}"
            continue
        results.append(result)
        print_result(result)
    elapsed = time.perf_counter() - started

    figures: dict[str, Any] = {}
    for key, name in HEADLINE.items():
        found = next((r for r in results if r.name == name), None)
        if found is not None and key in found.metrics:  # absent: e.g. no in-place step graph here
            figures[key] = float(found.metrics[key])
    print(
        f"\n== Summary ({elapsed:.0f} s in all{'; over the 18-minute budget' if elapsed > BUDGET_S else ''})"
    )
    for r in results:
        for check in r.checks:
            print(f"  {check.line()}")
    for name, error in failures.items():
        print(f"  {name}: FAILED ({error})")
    for name, reason in skipped.items():
        print(f"  {name}: skipped ({reason})")

    if opts.results is not None and results:
        append_results(opts.results, results, opts, title="run_all")
        print(f"appended to {opts.results}")
    if args.json is not None:
        write_json(
            args.json,
            {
                **figures,
                "targets": {
                    c.label: {"value": c.value, "target": c.target, "pass": c.passed}
                    for r in results
                    for c in r.checks
                },
                "details": {r.name: r.metrics for r in results},
                "failures": failures,
                "skipped": skipped,
                "seconds": {**{r.name: round(r.seconds, 1) for r in results}, "total": round(elapsed, 1)},
                "machine": machine_info(),
                "options": describe_options(opts),
            },
        )
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
