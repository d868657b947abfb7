"""A benchmark module as a script: its options, the run, the figures printed, recorded and written.

A benchmark module defines ``NAME``, ``TITLE``, ``add_arguments(parser)`` (its own options) and
``run(opts) -> Result``; ``main(module)`` turns that into a script that prints the figures, appends a
dated table to RESULTS.md and optionally writes JSON. ``run_all.py`` calls the same ``run`` functions.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import ModuleType

from benchmarks.options import (
    BENCH_DIR,
    DEFAULT_MODELS,
    DEFAULT_RESULTS,
    DEFAULT_THREADS,
    Options,
    describe_options,
)
from benchmarks.repository import fail_without_repository
from benchmarks.results import Result, append_results, machine_info, print_result
from harness.json_file import write_json


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--models", type=Path, default=DEFAULT_MODELS, help="model repository (default: models/)"
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke-test sizes, not figures")
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"ONNX Runtime intra-op threads, server and in-process (default {DEFAULT_THREADS}: one per core)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument(
        "--results", type=Path, default=DEFAULT_RESULTS, help="the markdown file the table is appended to"
    )
    parser.add_argument("--no-record", action="store_true", help="do not append to the results file")
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR, help="where plots are written")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    common = {"models", "quick", "threads", "device", "json", "results", "no_record", "out_dir"}
    return Options(
        models=args.models,
        quick=args.quick,
        threads=args.threads,
        device=args.device,
        results=None if args.no_record else args.results,
        out_dir=args.out_dir,
        extra={k: v for k, v in vars(args).items() if k not in common},
    )


def main(module: ModuleType) -> int:
    """Script entry point of a benchmark module: parse, check the repository, run, print, record."""
    parser = base_parser(module.TITLE)
    module.add_arguments(parser)
    args = parser.parse_args()
    opts = options_from(args)
    fail_without_repository(opts.models)
    result = timed_run(module, opts)
    print_result(result)
    if opts.results is not None:
        append_results(opts.results, [result], opts, title=result.title)
        print(f"appended to {opts.results}")
    if args.json is not None:
        write_json(
            args.json, {**result.metrics, "machine": machine_info(), "options": describe_options(opts)}
        )
    return 0


def timed_run(module: ModuleType, opts: Options) -> Result:
    started = time.perf_counter()
    result: Result = module.run(opts)
    result.seconds = time.perf_counter() - started
    return result
