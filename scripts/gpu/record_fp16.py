"""Record a GPU run's fp16 validations, and judge a repository's fp16 variants by them.

    python scripts/gpu/record_fp16.py --run DIR --models models --git COMMIT [--date YYYY-MM-DD]

``DIR`` is what ``device_run.py run`` brought back (``fp16.json``: each model's fp16 record, measured on
CUDA). ``--models`` is the repository that was packed for that run: its manifests give each model's
profile, training steps, version and the fp16 graphs' parity with their reference on ONNX Runtime's
CPU provider. Writes ``model_export/fp16_validation.json``, which every later export reads
(``model_export.variants.recorded_fp16``: fp16 of the same recipe then serves by default on CUDA where
the validation passed), and applies it to the repository's manifests now, without a rebuild.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_export.variants import FP16_RECORD, RULES, apply_recorded_fp16


def entry(folder: Path, measured: dict) -> dict:
    """One model's line of the record: what was validated (recipe and version) and what was measured."""
    manifest = json.loads((folder / "manifest.json").read_text())
    metric, tolerance, _ = RULES[manifest["task"]]
    local = manifest["variants"]["fp16"]
    return {
        "profile": manifest["training"]["profile"],
        "steps": manifest["training"]["steps"],
        "version": manifest["version"],
        "metric": metric,
        "reference": manifest["validation"]["validation"][metric],
        "fp16": measured["validation"][metric],
        "delta": measured["delta"][metric],
        "tolerance": tolerance,
        "passes": measured["serve_by_default"],
        "batch_max_abs_diff": measured["batch_max_abs_diff"],
        "cpu_parity_max_abs_diff": local["parity_max_abs_diff"],
        "reason_on_the_gpu": measured["reason"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the GPU run's output folder (fp16.json)")
    parser.add_argument("--models", type=Path, required=True, help="the repository packed for that run")
    parser.add_argument("--git", required=True, help="the commit the run ran")
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("--record", type=Path, default=FP16_RECORD)
    args = parser.parse_args()
    measured = json.loads((args.run / "fp16.json").read_text())
    devices = {r["validated_on"]["device"] for r in measured.values() if "validated_on" in r}
    runtimes = {r["validated_on"]["onnxruntime"] for r in measured.values() if "validated_on" in r}
    if len(devices) != 1 or len(runtimes) != 1:
        raise SystemExit(f"one run, one device: found {devices} with ONNX Runtime {runtimes}")
    record = {
        "about": "fp16 variants validated on CUDA by scripts/gpu/device_run.py; written by scripts/gpu/record_fp16.py",
        "device": devices.pop(),
        "onnxruntime": runtimes.pop(),
        "date": args.date,
        "git": args.git,
        "models": {
            name: entry(args.models / name, result)
            for name, result in sorted(measured.items())
            if "error" not in result
        },
    }
    args.record.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.record} ({len(record['models'])} models)")
    for name in record["models"]:
        judged = apply_recorded_fp16(args.models / name, args.record)
        print(
            f"{name}: {'serves fp16 on CUDA' if judged and judged['serve_by_default'] else 'fp16 not served'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
