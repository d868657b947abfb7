"""Fetch the all-MiniLM-L6-v2 BERT checkpoint into .cache/ (or --dest); print its path or "unavailable".

Always exits 0: without the checkpoint the build pretrains BERT from scratch instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_export.hf_checkpoint import DEFAULT_CHECKPOINT_DIR, fetch_minilm_checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, default=DEFAULT_CHECKPOINT_DIR, help="checkpoint directory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    path = fetch_minilm_checkpoint(args.dest)
    print(path if path is not None else "unavailable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
