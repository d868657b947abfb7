"""Every third-party module the service imports is a locked dependency: the image installs
``requirements.lock`` (made from pyproject's base dependencies) and nothing else, so a module that only the
developers' venv has through a dev extra (pyzmq came with locust) starts every test here and then fails the
container at its first import. Each import of ``service/`` is mapped to the distribution that provides it in
this venv, and that distribution must be pinned in the lock."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def top_level_imports(package: Path) -> set[str]:
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def locked(lock: Path) -> set[str]:
    return {
        _normal(line.split("==")[0])
        for line in lock.read_text().splitlines()
        if re.match(r"^[A-Za-z0-9]", line)
    }


def undeclared(package: Path, lock: Path) -> dict[str, list[str]]:
    """Module -> its distributions, for each third-party module ``package`` imports that the lock lacks."""
    providers = packages_distributions()
    pinned = locked(lock)
    missing = {}
    for module in sorted(
        top_level_imports(package) - set(sys.stdlib_module_names) - {"service", "__future__"}
    ):
        dists = providers.get(module, [])
        if not any(_normal(d) in pinned for d in dists):
            missing[module] = dists
    return missing


def test_every_module_the_service_imports_is_locked() -> None:
    assert undeclared(ROOT / "service", ROOT / "requirements.lock") == {}


def test_a_module_missing_from_the_lock_is_found(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "\n".join(
            line
            for line in (ROOT / "requirements.lock").read_text().splitlines()
            if not line.startswith("pyzmq")
        )
    )
    assert "zmq" in undeclared(ROOT / "service", lock)
