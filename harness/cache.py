"""The cache that outlives a clone: built test models, the private podman state and the lint caches (mypy's,
import-linter's: the Makefile's LINT_CACHE), keyed by content.

``TSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/transformer-serving``, else ``~/.cache/transformer-serving``.
Everything in it is named by what it was built from (a hash of the sources for the tiny models; podman's
own layer cache, keyed on each instruction and the content it copies, for the images), so a fresh clone
of the same tree reuses it, and a changed tree builds anew beside it. Deleting it is always safe: the next
run rebuilds (`make clean-cache`).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("TSERVE_CACHE_DIR"):
        return Path(os.environ["TSERVE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "transformer-serving"
