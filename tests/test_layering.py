"""The layering rules hold, and fail when broken on purpose.

``lint-imports`` (import-linter, ``[tool.importlinter]`` in pyproject.toml, run by ``make lint``)
checks seven contracts: the engine imports nothing above it (nor the key checks nor ipc), the pipelines import
no ipc, the doors reach the engine and the
pipelines only through the inference core, the shared layers (HTTP, the Open Inference Protocol)
import no door, no door imports a sibling (the gRPC door and the v2 HTTP door share ``api/oip``), a
front end of the split service never imports the engine process's server, and the engine process's
side (``engine_host``, ``models``) imports no door, key check or response cache. Here it runs on a copy
of ``service/`` with one import added that breaks each rule.
"""

from __future__ import annotations

import ast
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
        (  # what models/host.py did: a module of the core, whose package imports the cache and the quotas
            "service/models/sneak.py",
            "import service.inference.limits",
            "The engine process imports no door, no key check and no response cache",
        ),
        (
            "service/pipelines/sneak.py",
            "import service.ipc.client",
            "The pipelines reach compute only through",
        ),
        ("service/engine/sneak.py", "import service.access.keys", "The engine imports nothing above it"),
    ],
)
def test_a_broken_rule_fails(tree: Path, module: str, line: str, contract: str) -> None:
    (tree / module).write_text(f'"""An import that breaks a rule."""\n\n{line}\n')
    result = _lint(tree)
    assert result.returncode != 0
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout
    assert "1 broken" in result.stdout


def test_the_engine_process_loads_no_door_key_check_or_cache_at_run_time() -> None:
    """What the contracts cannot see: a package's ``__init__`` runs whenever one of its modules is
    imported. The engine process's modules, imported alone, leave none of those packages loaded."""
    script = (
        "import sys, service.engine_host.__main__, service.engine_host.server\n"
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('service.') and m.count('.')}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    loaded = set(eval(result.stdout))
    assert "engine" in loaded and "models" in loaded  # it ran
    assert loaded.isdisjoint({"api", "access", "cache", "inference"}), loaded


# --- request metadata in the open ---------------------------------------------------------------------

# Below the doors, what a request carries (its scheduling, its key, its prefix salt, its trace) is passed in
# every signature as a ``RequestMeta`` (service/metadata.py); nothing there reads a context variable for it.
# ``note_model`` stays: it feeds the request's log lines and metrics, and decides nothing.
BELOW_THE_DOORS = ("engine", "pipelines", "models", "inference", "ipc")
LOGGING_ONLY = {"note_model"}


def hidden_metadata(source: str) -> list[str]:
    """What in ``source`` would let a request's metadata travel hidden: a ContextVar, or the doors' context."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in ("contextvars", "service.context")]
        elif isinstance(node, ast.ImportFrom):
            if node.module == "contextvars":
                found.append("contextvars")
            elif node.module == "service.context":
                found += [f"service.context.{a.name}" for a in node.names if a.name not in LOGGING_ONLY]
        elif isinstance(node, ast.Name | ast.Attribute) and (
            getattr(node, "id", None) == "ContextVar" or getattr(node, "attr", None) == "ContextVar"
        ):
            found.append("ContextVar")
    return found


def test_nothing_below_the_doors_reads_a_context_variable() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for package in BELOW_THE_DOORS
        for path in sorted((ROOT / "service" / package).rglob("*.py"))
        if (found := hidden_metadata(path.read_text()))
    }
    assert offenders == {}, offenders


@pytest.mark.parametrize(
    "line",
    [
        "from contextvars import ContextVar",
        "import contextvars",
        "from service.context import current",
        "x: ContextVar[int]",
    ],
)
def test_a_hidden_read_is_found(line: str) -> None:
    assert hidden_metadata(line) != []
    assert hidden_metadata("from service.context import note_model") == []
