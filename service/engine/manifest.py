"""The model-repository contract shared by export (writer) and service (reader): names, hashing, tasks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
MANIFEST = "manifest.json"

# task -> graphs the folder must hold
TASK_GRAPHS = {
    "translation": ("encoder", "decoder"),
    "text-classification": ("model",),
    "question-answering": ("model",),
    "token-classification": ("model",),
    "text-generation": ("model",),
    "image-classification": ("model",),
}
TEXT_TASKS = {
    "translation",
    "text-classification",
    "question-answering",
    "token-classification",
    "text-generation",
}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_version(files: dict[str, dict[str, Any]]) -> str:
    """The model version: a hash over the served files' hashes, so new weights always mean a new version."""
    joined = "".join(f"{name}:{entry['sha256']}\n" for name, entry in sorted(files.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]
