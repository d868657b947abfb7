"""Publishing a build as a new version of a model folder, with one atomic rename.

``python -m model_export all --publish-version`` builds each model whole (export, evaluation,
variants) in ``<repository>/.staging/<name>`` (a hidden folder the service passes over), then renames
it to ``<repository>/<name>/<N>``, N one past the highest version folder there (Triton's layout,
``docs/MODEL_REPOSITORY.md``). The rename is the only step a running service can see, so a server in
``MODEL_CONTROL_MODE=poll`` finds a whole version or nothing, and the versions already there are never
touched.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STAGING = ".staging"


class PublishError(Exception):
    pass


def next_version(model_folder: Path) -> int:
    """One past the highest numbered version folder (1 for a new model); a flat model folder, whose only
    version is the folder itself, cannot take numbered versions beside it."""
    if (model_folder / MANIFEST).is_file():
        raise PublishError(
            f"{model_folder} holds one version as a flat folder; move its files into "
            f"{model_folder / '1'} (its version 1) to publish numbered versions beside it"
        )
    numbers = [int(p.name) for p in model_folder.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(numbers, default=0) + 1


def publish_version(staged: Path, model_folder: Path) -> Path:
    """Rename the finished build ``staged`` to the model folder's next version folder; returns it."""
    if not (staged / MANIFEST).is_file():
        raise PublishError(f"{staged} holds no {MANIFEST}: the build did not finish")
    model_folder.mkdir(parents=True, exist_ok=True)
    target = model_folder / str(next_version(model_folder))
    staged.rename(target)  # atomic: both lie in the repository, on one file system
    log.info("%s: published as version %s (%s)", model_folder.name, target.name, target)
    return target


def clear_staging(repository: Path, name: str) -> Path:
    """A fresh staging place for model ``name``'s build."""
    stage = repository / STAGING
    shutil.rmtree(stage / name, ignore_errors=True)
    stage.mkdir(parents=True, exist_ok=True)
    return stage
