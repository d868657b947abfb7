"""``python -m service.engine_host`` on the fake engine (``fake_engine.py``): the split service's engine
process for ``fake_serve.py`` with FRONTENDS >= 1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("KV_CACHE", "concat")
sys.path.append(str(Path(__file__).resolve().parent))

from fake_engine import install

install()

from service.engine_host.__main__ import main  # noqa: E402

if __name__ == "__main__":
    main()
