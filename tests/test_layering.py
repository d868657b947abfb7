"""The layering rules hold, and fail when broken on purpose.

``lint-imports`` (import-linter, ``[tool.importlinter]`` in pyproject.toml, run by ``make lint``)
checks six contracts: the engine imports nothing above it, the doors reach the engine and the
pipelines only through the inference core, the shared layers (HTTP, the Open Inference Protocol)
import no door, no door imports a sibling (the gRPC door and the v2 HTTP door share ``api/oip``), a
front end of the split service never imports the engine process's server, and the engine process's
side (``engine_host``, ``models``) imports no door, key check or response cache. Here it runs on a copy
of ``service/`` with one import added that breaks each rule.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT)], cwd=tree, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "service", tmp_path / "service", ignore=shutil.ignore_patterns("__pycache__", "static")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "service/engine/sneak.py",
            "import service.api.rest.classify",
            "The engine imports nothing above it",
        ),
        (
            "service/api/rest/sneak.py",
            "import service.engine.batcher",
            "The doors reach the engine and the pipelines",
        ),
        (
            "service/api/http/sneak.py",
            "import service.api.rest.envelope",
            "The shared layers (HTTP, the Open Inference Protocol) import no door",
        ),
        (
            "service/api/oip/sneak.py",
            "import service.api.v2.routes",
            "The shared layers (HTTP, the Open Inference Protocol) import no door",
        ),
        ("service/api/grpc/sneak.py", "import service.api.v2.tensors", "No door imports a sibling door"),
        ("service/api/openai/sneak.py", "import service.api.v2.schemas", "No door imports a sibling door"),
        (
            "service/ipc/sneak.py",
            "import service.engine_host.server",
            "A front end never imports the engine process's server",
        ),
        (
            "service/models/sneak.py",
            "import service.access.quotas",
            "The engine process imports no door, no key check and no response cache",
        ),
    ],
)
def test_a_broken_rule_fails(tree: Path, module: str, line: str, contract: str) -> None:
    (tree / module).write_text(f'"""An import that breaks a rule."""\n\n{line}\n')
    result = _lint(tree)
    assert result.returncode != 0
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout
    assert "1 broken" in result.stdout
