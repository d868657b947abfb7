"""Every module of the service imports first, in an interpreter of its own: an import cycle that the usual
order hides (the app imports the inference core before the model host) cannot wait for the one process
that starts with the other end. The split's engine process starts with ``service.models.host``; a cycle
through it once restarted the engine forever while every in-process test passed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each module in a child forked from an interpreter that has imported nothing of the service, two at once.
# The parent imports the third-party modules the service names first (argv before "--"), so that each child
# pays for its service modules alone: litestar, onnxruntime, opentelemetry and the rest once, not per module.
# A cycle among the service's own modules shows as before, since none of them is in the parent.
_IMPORT_EACH = """
import importlib, multiprocessing as mp, sys, traceback

cut = sys.argv.index("--")
for outside in sys.argv[1:cut]:
    try:
        importlib.import_module(outside)
    except Exception:
        pass  # an optional dependency (CUDA's, say): the child that needs it reports it

def one(name):
    try:
        importlib.import_module(name)
    except BaseException:
        return name, traceback.format_exc(limit=4)
    return name, None

if __name__ == "__main__":
    names = sys.argv[cut + 1:]
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


def _third_party(package: Path) -> list[str]:
    """Every module outside the standard library and ``package`` that a file of ``package`` imports."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    own = package.name
    return sorted(
        n for n in found if n.split(".")[0] not in sys.stdlib_module_names and n.split(".")[0] != own
    )


def test_every_service_module_imports_first() -> None:
    names = _modules(ROOT / "service")
    assert "service.models.host" in names and "service.engine_host.__main__" in names
    outside = _third_party(ROOT / "service")
    assert "litestar" in outside and not any(n.startswith("service") for n in outside)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *outside, "--", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
