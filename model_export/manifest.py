"""Writing manifest.json: the contract between export and service (``service.engine.manifest.Manifest``).

The version is a content hash of the files the service loads (graphs and
tokenizer), so any retraining or re-export gives a new version, and cache
entries made by an older model can never be served for a newer one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.engine.manifest import FORMAT_VERSION, MANIFEST, Manifest, content_version, file_sha256


def write_manifest(model_dir: Path, manifest: dict[str, Any], served_files: list[str]) -> dict[str, Any]:
    """Hash the served files, stamp the version and write manifest.json; returns what was written.

    What is written must parse as the service's ``Manifest``: an export that breaks the
    contract fails here, not when the service refuses the folder.
    """
    files = {}
    for name in served_files:
        path = model_dir / name
        assert path.is_file(), f"{path} was not written"
        files[name] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    manifest = {
        "format_version": FORMAT_VERSION,
        **manifest,
        "files": files,
        "version": content_version(files),
    }
    Manifest.model_validate(manifest)
    (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / MANIFEST).read_text())


def record_validation(model_dir: Path, split: str, metrics: dict[str, Any]) -> None:
    """Store evaluation figures in the manifest; the version (a hash of the served files) is unchanged."""
    manifest = read_manifest(model_dir)
    manifest.setdefault("validation", {})[split] = metrics
    (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
