"""Every module of the service imports first, in an interpreter of its own: an import cycle that the usual
order hides (the app imports the inference core before the model host) cannot wait for the one process
that starts with the other end. The split's engine process starts with ``service.models.host``; a cycle
through it once restarted the engine forever while every in-process test passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each module in a child forked from an interpreter that has imported nothing of the service, two at once.
_IMPORT_EACH = """
import importlib, multiprocessing as mp, sys, traceback

def one(name):
    try:
        importlib.import_module(name)
    except BaseException:
        return name, traceback.format_exc(limit=4)
    return name, None

if __name__ == "__main__":
    names = sys.argv[1:]
    with mp.get_context("fork").Pool(2, maxtasksperchild=1) as pool:
        failed = [(n, e) for n, e in pool.imap_unordered(one, names) if e]
    for name, error in failed:
        print("FAILED", name, error, sep="\\n")
    sys.exit(1 if failed else 0)
"""


def _modules(package: Path) -> list[str]:
    names = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def test_every_service_module_imports_first() -> None:
    names = _modules(ROOT / "service")
    assert "service.models.host" in names and "service.engine_host.__main__" in names
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
