"""Every repository path named in the code's comments and docstrings, and in the docs, exists.

A file moves and the sentences that point at it stay behind: a reader then looks for what is gone.
Paths are read where people write them for people (comments and docstrings of the Python files, the
Markdown documents, the Makefile's and pyproject's comments), not in string literals, which tests use
to make files. A path counts when it starts at one of the repository's top folders and ends with a
file's extension or a slash.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("service", "model_export", "benchmarks", "scripts", "tests", "harness", "loadtests", "docs", "deploy")
TOPS = "|".join(TOP)
EXTENSIONS = "py|md|json|ya?ml|sh|toml|png|txt|proto|cfg|j2"
PATH = re.compile(
    rf"(?<![\w./-])(?:\.\./)?((?:{TOPS})/[\w./-]*?(?:\.(?:{EXTENSIONS})\b|/(?=[\s`)'\",;:]|$)))"
)
# Paths in another project's tree, named as such
ELSEWHERE = {("tests/parity.py", "tests/models/utils.py")}  # vLLM's


def _python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                first = node.body[0].lineno
                for offset, line in enumerate(doc.splitlines()):
                    yield first + offset, line


def _comments(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "#" in line:
            yield number, line[line.index("#") :]


def _prose() -> Iterator[tuple[str, int, str]]:
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*")):
            if any(part in ("static", "__pycache__", "crds") for part in path.parts) or not path.is_file():
                continue
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix == ".py":
                yield from ((rel, n, text) for n, text in _python_prose(path))
            elif path.suffix == ".md":
                yield from (
                    (rel, n, text) for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                )
    for name in ("README.md",):
        yield from (
            (name, n, text)
            for n, text in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
        )
    for name in ("Makefile", "pyproject.toml", "Dockerfile"):
        yield from ((name, n, text) for n, text in _comments(ROOT / name))


def test_every_path_named_in_prose_exists() -> None:
    missing, seen = [], 0
    for where, line, text in _prose():
        for match in PATH.finditer(text):
            named = match.group(1)
            seen += 1
            if (where, named) in ELSEWHERE:
                continue
            if not (ROOT / named).exists():
                missing.append(f"{where}:{line}: {named}")
    assert seen > 300  # the prose is read: hundreds of paths are named in it
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)


def test_the_check_sees_a_moved_file() -> None:
    """The pattern finds paths the way they are written here (backquoted, in parentheses, relative links)."""
    written = (
        "see (``service/api/tensors.py``), [x](../docs/NOWHERE.md) and deploy/k8s/ and `scripts/gpu/pack.py`."
    )
    found = [m.group(1) for m in PATH.finditer(written)]
    assert found == ["service/api/tensors.py", "docs/NOWHERE.md", "deploy/k8s/", "scripts/gpu/pack.py"]
    assert [f for f in found if not (ROOT / f).exists()] == ["service/api/tensors.py", "docs/NOWHERE.md"]
