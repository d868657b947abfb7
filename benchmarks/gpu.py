"""The GPU table: the benchmarks that say what CUDA buys, sized to fit a few minutes of a lent GPU.

    python benchmarks/gpu.py --device cuda [--models DIR] [--json FILE] [--results FILE] [--budget-s 240]

Runs, in this order (most wanted first), each with GPU-sized options, every ratio measured side by side
in one run on the same machine:

- (b) dynamic batching: served classify throughput at 32 clients, MAX_BATCH_SIZE=32 vs 1, with one
  worker and with four (the service's per-request work is CPU: one process caps what a GPU can serve);
- (d) continuous batching: generated tokens/s with 16 and 64 streams vs 1;
- (a) KV cache vs recomputing the prefix;
- (m) IO binding vs plain ``run`` (``io_binding.py``);
- (h) fp16 vs fp32, raw ONNX Runtime (``variants.py``, fp16 in place of int8 on CUDA);
- (c) served vs raw ONNX Runtime;
- (i) served fp16 vs fused fp32: classify requests/s and generate tokens/s at 32 clients, p50 and p99.

A benchmark that fails is reported and the others still run; once ``--budget-s`` has passed, the rest
are skipped, saying so, so that what was measured is always written. Appends one section to the
results file (the GPU named in its machine column) and writes every figure to the JSON file.
``scripts/gpu/device_run.py`` runs it on the lent machine.
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
    io_binding,
    kv_cache,
    overhead,
    served_variants,
    variants,
)
from benchmarks.cli import base_parser, options_from, timed_run
from benchmarks.options import describe_options
from benchmarks.repository import fail_without_repository
from benchmarks.results import Result, append_results, machine_info, print_result
from harness.json_file import write_json

# (module, its options on a GPU); --quick keeps each module's own quick sizes instead.
PLAN: list[tuple[ModuleType, dict[str, Any]]] = [
    (batching, {"concurrency": [1, 32], "duration": 4.0, "rounds": 2}),
    (batching, {"concurrency": [1, 32, 64], "duration": 4.0, "rounds": 1, "workers": 4}),
    (
        continuous_batching,
        {
            "streams": [1, 16, 64],
            "duration": 4.0,
            "rounds": 2,
            "max_new_tokens": 64,
            "max_running_sequences": 64,
        },
    ),
    (kv_cache, {"repeats": 3}),
    (io_binding, {"rounds": 5, "new_tokens": 64}),
    (variants, {"rounds": 2, "seconds": 1.5}),
    (overhead, {"duration": 12.0, "rounds": 3, "passes": 1, "concurrency": 64}),
    (served_variants, {"duration": 4.0, "rounds": 2, "clients": 32}),
]


def main() -> int:
    parser = base_parser("The GPU table: batching, streams, KV cache, IO binding, fp16, overhead, load")
    parser.add_argument(
        "--budget-s", type=float, default=240, help="start no benchmark after this many seconds"
    )
    args = parser.parse_args()
    opts = options_from(args)
    fail_without_repository(opts.models)
    started = time.perf_counter()
    results: list[Result] = []
    status: dict[str, str] = {}
    for module, extra in PLAN:
        key = module.NAME + (f"_{extra['workers']}_workers" if extra.get("workers", 1) > 1 else "")
        if time.perf_counter() - started > args.budget_s:
            status[key] = f"skipped: the {args.budget_s:g} s budget was spent"
            print(f"\n-> {module.TITLE}\n{status[key]}", flush=True)
            continue
        print(f"\n-> {module.TITLE}", flush=True)
        opts.extra = {} if opts.quick else dict(extra)
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
        append_results(
            opts.results, results, opts, title=f"GPU table ({len(results)} benchmarks, {elapsed:.0f} s)"
        )
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
            },
        )
    return (
        0 if results and all(s.startswith("ran") or s.startswith("skipped") for s in status.values()) else 1
    )


if __name__ == "__main__":
    sys.exit(main())
