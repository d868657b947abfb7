"""``python -m service`` on the fake engine (``benchmarks/fake_engine.py``): the request path alone; with
FRONTENDS >= 1, the split service's engine process on it too (``fake_engine_host.py``).

The fake sessions are installed before the app is built; everything else is the real service,
configured by the same environment variables. ``KV_CACHE`` defaults to ``concat`` here (the in-place
step graphs need IO binding, which the fake sessions do not have). Run from any checkout: the service
imported is the one first on ``PYTHONPATH`` (``benchmarks/request_path.py`` runs an older commit's
service this way, as the baseline), the fake engine this file's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("KV_CACHE", "concat")
sys.path.append(str(Path(__file__).resolve().parent))  # fake_engine, after the service's own checkout

from fake_engine import install

install()

from service.__main__ import main  # noqa: E402

try:
    from service import supervisor
except ImportError:  # an older service (request_path.py's baseline) is one process only
    pass
else:  # the split service (FRONTENDS >= 1): its engine process runs on the fake engine too
    supervisor.ENGINE_COMMAND = [
        sys.executable,
        str(Path(__file__).resolve().with_name("fake_engine_host.py")),
    ]

if __name__ == "__main__":
    main()
