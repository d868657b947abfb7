"""No folder of the project's code is ignored by git: a module added to any of them is committed.

``.gitignore`` once held ``models/`` for the repository's model folder, which matched ``service/models/``
as well: the files moved there with ``git mv`` stayed tracked, a new one (``host.py``) was silently left
out, and only a clean checkout (CI's) found the import missing. Every folder that holds tracked Python is
asked here, for a module name that does not exist yet, whether git would ignore it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout"
)


def _git(root: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=root, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def ignored_new_modules(root: Path) -> list[str]:
    """For each folder holding a tracked ``.py`` file, a new module there that git would ignore, and why."""
    tracked = _git(root, "ls-files", "*.py").stdout.split()
    folders = sorted({str(Path(p).parent) for p in tracked})
    probes = "".join(f"{folder}/a_module_added_later.py\n" for folder in folders)
    answer = _git(root, "check-ignore", "--no-index", "-v", "--stdin", stdin=probes)
    assert answer.returncode in (0, 1), answer.stderr  # 1: nothing ignored
    return answer.stdout.splitlines()


def test_no_folder_of_code_is_ignored() -> None:
    assert ignored_new_modules(ROOT) == []


def test_the_check_finds_a_rule_that_hides_a_package(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "service" / "models").mkdir(parents=True)
    (tmp_path / "service" / "models" / "loading.py").write_text("")
    (tmp_path / "service" / "app.py").write_text("")
    _git(tmp_path, "add", ".")
    (tmp_path / ".gitignore").write_text("models/\n")  # the rule as it was
    found = ignored_new_modules(tmp_path)
    assert len(found) == 1 and "service/models/a_module_added_later.py" in found[0], found
    (tmp_path / ".gitignore").write_text("/models/\n")  # anchored to the root: the package is code again
    assert ignored_new_modules(tmp_path) == []
