"""The model repository a benchmark runs on: checked, searched by task, narrowed to what a server needs."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


def fail_without_repository(models: Path) -> None:
    """Exit with a clear message when ``models`` is not a model repository."""
    if not models.is_dir():
        sys.exit(
            f"error: model repository {models} does not exist. Build it first "
            "(`make serve`, or `python -m model_export all --profile default --out models`; "
            "`--profile tiny` for a fast look) or pass --models DIR."
        )
    if not any((p / "manifest.json").is_file() for p in models.iterdir() if p.is_dir()):
        sys.exit(f"error: {models} holds no model folder (no */manifest.json): is the build still running?")


def find_model(models: Path, task: str) -> Path:
    """The folder serving ``task`` (the first in name order, as the service picks its default)."""
    for folder in sorted(p for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")):
        manifest = folder / "manifest.json"
        if folder.name.endswith(".partial") or not manifest.is_file():
            continue
        with contextlib.suppress(ValueError, OSError):
            if json.loads(manifest.read_text()).get("task") == task:
                return folder
    sys.exit(f"error: {models} has no {task} model (no folder whose manifest.json says task {task!r})")


def model_folders(models: Path) -> list[Path]:
    return sorted(
        p
        for p in models.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and not p.name.endswith(".partial")
        and (p / "manifest.json").is_file()
    )


@contextlib.contextmanager
def subset_repository(folders: Sequence[Path]) -> Iterator[Path]:
    """A temporary repository holding only ``folders`` (symlinks), so a server loads what it needs."""
    root = Path(tempfile.mkdtemp(prefix="bench-repo-"))
    try:
        for folder in folders:
            (root / folder.name).symlink_to(folder.resolve(), target_is_directory=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
