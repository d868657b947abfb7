"""Check and evaluate every model's fp16 variant on CUDA, and record it in the model's manifest.

    python scripts/gpu/validate_fp16.py --models DIR [--only NAME ...] [--json FILE] [--limit N] [--dry-run]

The export writes fp16 graphs everywhere but can validate them only where it has CUDA
(``model_export/variants.py``). This is that validation for a repository built on a CPU machine:
``model_export.variants.validate_on_cuda`` per model (parity and batch independence on CUDA, a
validation pass on CUDA, the accuracy rule), the manifests updated in place, and one JSON of every
model's fp16 record. A model that fails is reported and the others still run. ``--dry-run`` (no GPU)
runs the same code on ONNX Runtime's CPU provider over a few examples and writes no manifest.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from model_export.data import resolve_data_dir
from model_export.variants import validate_on_cuda


def _has_fp16(manifest_path: Path) -> bool:
    """An fp16 variant, or fp16 graphs carried alone (``scripts/gpu/pack.py``)."""
    manifest = json.loads(manifest_path.read_text())
    return "fp16" in manifest.get("variants", {}) or "fp16_record" in manifest.get("carried", {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--only", nargs="+", default=None, help="these models (default: every one with fp16)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="examples per validation pass (default: all)")
    parser.add_argument(
        "--dry-run", action="store_true", help="no GPU: CPU provider, 4 examples, no manifest"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data_dir = resolve_data_dir()
    models = args.models
    if args.dry_run:  # a private copy: the manifests of the real repository stay as they are
        models = Path(tempfile.mkdtemp()) / "models"
        shutil.copytree(args.models, models, ignore=shutil.ignore_patterns(".work"))
    # The translator last: its beam-search pass is the longest, and a deadline should cut it, not the rest.
    names = args.only or sorted(
        (p.parent.name for p in models.glob("*/manifest.json") if _has_fp16(p)),
        key=lambda n: (n == "translator", n),
    )
    found: dict[str, object] = {}
    for name in names:
        started = time.perf_counter()
        try:
            record = validate_on_cuda(
                models,
                name,
                data_dir,
                limit=4 if args.dry_run else args.limit,
                device="cpu" if args.dry_run else "cuda",
            )
        except Exception as exc:  # one model's failure must not hide the others'
            traceback.print_exc()
            found[name] = {"error": f"{type(exc).__name__}: {exc}"}
            if args.json is not None:
                args.json.write_text(json.dumps(found, indent=1) + "\n")
            continue
        found[name] = record
        print(f"{name}: {record['reason']} ({time.perf_counter() - started:.0f} s)", flush=True)
        if args.json is not None:  # after each model: a run stopped at its deadline keeps what it measured
            args.json.write_text(json.dumps(found, indent=1) + "\n")
    return 0 if all("error" not in r for r in found.values() if isinstance(r, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
