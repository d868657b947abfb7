"""The GPU table: the benchmarks that say what CUDA buys, sized to fit a few minutes of a lent GPU.

    python benchmarks/gpu.py --device cuda [--phase engine|table|all] [--models DIR] [--json FILE]
        [--results FILE] [--budget-s 240] [--triton-python PYTHON]

Two phases, each one device call at most (``scripts/gpu/device_run.py`` runs them), every ratio measured
side by side in one run on the same machine, most wanted first within each:

- ``engine``: (g) the engine's own CUDA choices, in process (``gpu_engine.py``): the KV cache in device
  buffers against the Concat decoder, CUDA graphs on and off, TensorRT against CUDA fp16 with start-up
  times, pinned memory;
- ``table``: (a) KV cache vs recomputation (GPT, 255 tokens); (d) continuous batching at 16 and 64 streams
  vs 1, with CUDA graphs off and on; (b) dynamic batching at saturation (classify, MAX_BATCH_SIZE 32 vs 1, up
  to 64 clients); (c) served vs raw; (w) classify, generate and translate at 32, 64 and 256 connections
  (wrk); (t) Triton through PyTriton on the same fp16 file (the parity check first); then, budget allowing,
  (m) IO binding, (h) fp16 vs fp32 raw and (i) served fp16 vs fused.

A benchmark that fails is reported and the others still run; once ``--budget-s`` has passed, the rest
are skipped, saying so, so that what was measured is always written. Appends one section to the
results file (the GPU named in its machine column) and writes every figure to the JSON file.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/gpu.py` anywhere

from benchmarks import (
    batching,
    continuous_batching,
    gpu_engine,
    io_binding,
    kv_cache,
    overhead,
    served_variants,
    triton_gpu,
    variants,
    wrk_sweep,
)
from benchmarks.cli import base_parser, options_from, timed_run
from benchmarks.options import describe_options
from benchmarks.repository import fail_without_repository
from benchmarks.results import Result, append_results, machine_info, print_result
from harness.json_file import write_json

# phase -> (key, module, its options on a GPU); --quick keeps each module's own quick sizes instead.
PLAN: dict[str, list[tuple[str, ModuleType, dict[str, Any]]]] = {
    "engine": [
        ("gpu_engine", gpu_engine, {"rounds": 3}),
    ],
    "table": [
        ("kv_cache", kv_cache, {"repeats": 3}),
        (
            "continuous_batching",
            continuous_batching,
            {
                "streams": [1, 16, 64],
                "duration": 4.0,
                "rounds": 2,
                "max_new_tokens": 64,
                "max_running_sequences": 64,
            },
        ),
        (
            "continuous_batching_cuda_graphs",
            continuous_batching,
            {
                "streams": [1, 16, 64],
                "duration": 4.0,
                "rounds": 2,
                "max_new_tokens": 64,
                "max_running_sequences": 64,
                "server_env": {"CUDA_GRAPHS": "true"},
            },
        ),
        ("batching", batching, {"concurrency": [1, 32, 64], "duration": 4.0, "rounds": 2}),
        ("overhead", overhead, {"duration": 8.0, "rounds": 2, "passes": 1, "concurrency": 64}),
        ("wrk_sweep", wrk_sweep, {"duration": 4.0, "connections": [32, 64, 256]}),
        ("triton_gpu", triton_gpu, {"duration": 4.0, "connections": [32, 64, 256]}),
        ("io_binding", io_binding, {"rounds": 5, "new_tokens": 64}),
        ("variants", variants, {"rounds": 2, "seconds": 1.5}),
        ("served_variants", served_variants, {"duration": 4.0, "rounds": 2, "clients": 32}),
    ],
}
PLAN["all"] = PLAN["engine"] + PLAN["table"]
# What a module takes from the command line whatever its plan says (the venvs and tools the run made).
PASSED_THROUGH = ("triton_python",)


def main() -> int:
    parser = base_parser("The GPU table: batching, streams, KV cache, IO binding, fp16, overhead, load")
    parser.add_argument(
        "--budget-s", type=float, default=240, help="start no benchmark after this many seconds"
    )
    parser.add_argument("--phase", choices=sorted(PLAN), default="all", help="which part of the table")
    parser.add_argument("--triton-python", type=Path, default=None, help="PyTriton's venv python, for (t)")
    args = parser.parse_args()
    opts = options_from(args)
    fail_without_repository(opts.models)
    started = time.perf_counter()
    results: list[Result] = []
    status: dict[str, str] = {}
    given = {name: getattr(args, name) for name in PASSED_THROUGH if getattr(args, name) is not None}
    for key, module, extra in PLAN[args.phase]:
        if time.perf_counter() - started > args.budget_s:
            status[key] = f"skipped: the {args.budget_s:g} s budget was spent"
            print(f"\n-> {module.TITLE}\n{status[key]}", flush=True)
            continue
        print(f"\n-> {module.TITLE}", flush=True)
        opts.extra = {**({} if opts.quick else dict(extra)), **given}
        if opts.quick and "server_env" in extra:  # what the entry is about, quick or not
            opts.extra["server_env"] = extra["server_env"]
        reason = module.skip_reason(opts) if hasattr(module, "skip_reason") else None
        if reason is not None:
            status[key] = f"skipped: {reason}"
            print(status[key], flush=True)
            continue
        try:
            result = timed_run(module, opts)
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            traceback.print_exc()
            status[key] = f"failed: {type(exc).__name__}: {exc}"
            continue
        status[key] = f"ran in {result.seconds:.0f} s"
        result.name = key
        results.append(result)
        print_result(result)
    elapsed = time.perf_counter() - started
    print(
        f"\nGPU benchmarks: {elapsed:.0f} s; " + "; ".join(f"{k}: {v}" for k, v in status.items()), flush=True
    )
    if opts.results is not None and results:
        title = f"GPU table, {args.phase} ({len(results)} benchmarks, {elapsed:.0f} s)"
        append_results(opts.results, results, opts, title=title)
    if args.json is not None:
        write_json(
            args.json,
            {
                "status": status,
                "details": {r.name: r.metrics for r in results},
                "tables": {r.name: r.details for r in results},
                "machine": machine_info(),
                "options": describe_options(opts),
                "seconds": elapsed,
                "phase": args.phase,
            },
        )
    return (
        0 if results and all(s.startswith("ran") or s.startswith("skipped") for s in status.values()) else 1
    )


if __name__ == "__main__":
    sys.exit(main())
