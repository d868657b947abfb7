"""A model's versions in the repository, and which of them serve.

Two layouts, as in Triton's model repository:

    models/gpt/manifest.json ...            one version, the folder itself (what the exporter wrote
                                            before versions, and still the default)
    models/gpt/1/manifest.json ...          numbered version folders (positive integers); the newest
    models/gpt/2/manifest.json ...          is the highest number
    models/gpt/config.json                  optional: {"version_policy": ...}

A version policy says which versions serve, in Triton's words: ``{"latest": {"num_versions": N}}``
(the default, with N = 1), ``{"specific": {"versions": [1, 3]}}`` or ``{"all": {}}``. It lives in
the model's ``config.json``; the MODEL_VERSION_POLICY setting overrides it per model.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .manifest import MANIFEST

log = logging.getLogger(__name__)

CONFIG = "config.json"


class VersionPolicyError(ValueError):
    pass


@dataclass(frozen=True)
class VersionFolder:
    label: str  # the version folder's number; "" for a model folder that is its only version
    path: Path


@dataclass(frozen=True)
class VersionPolicy:
    latest: int | None = 1  # the newest N versions serve
    specific: tuple[int, ...] = ()  # these versions serve (latest None)
    every: bool = False  # every version serves

    @classmethod
    def parse(cls, raw: Any) -> VersionPolicy:
        """From Triton's JSON form: ``{"latest": {"num_versions": 2}}``, ``{"specific": {"versions": [1]}}``,
        ``{"all": {}}``; anything else raises ``VersionPolicyError`` saying what is accepted."""
        if isinstance(raw, dict) and len(raw) == 1:
            ((kind, body),) = raw.items()
            body = body if isinstance(body, dict) else {}
            if kind == "all":
                return cls(latest=None, every=True)
            if kind == "latest":
                n = body.get("num_versions", 1)
                if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                    return cls(latest=n)
            if kind == "specific":
                versions = body.get("versions")
                if isinstance(versions, list) and versions and all(_positive(v) for v in versions):
                    return cls(latest=None, specific=tuple(int(v) for v in versions))
        raise VersionPolicyError(
            f'version_policy {raw!r} is not one of {{"latest": {{"num_versions": N}}}}, '
            '{"specific": {"versions": [1, 2]}}, {"all": {}}'
        )

    def choose(self, versions: list[VersionFolder]) -> list[VersionFolder]:
        """The versions that serve, newest first (a flat folder is its own one version)."""
        numbered = sorted((v for v in versions if v.label), key=lambda v: int(v.label), reverse=True)
        if not numbered:
            return versions
        if self.every:
            return numbered
        if self.specific:
            return [v for v in numbered if int(v.label) in self.specific]
        return numbered[: self.latest or 1]


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def version_folders(folder: Path) -> list[VersionFolder]:
    """The model folder's versions: itself when it holds a manifest, else its numbered subfolders that
    do (oldest first); a subfolder named otherwise is passed over (``.partial`` work folders among them)."""
    if (folder / MANIFEST).is_file():
        return [VersionFolder("", folder)]
    found = []
    for sub in folder.iterdir() if folder.is_dir() else []:
        if sub.is_dir() and sub.name.isdigit() and int(sub.name) >= 1 and (sub / MANIFEST).is_file():
            found.append(VersionFolder(str(int(sub.name)), sub))
    return sorted(found, key=lambda v: int(v.label))


def policy_of(folder: Path, override: Any = None) -> VersionPolicy:
    """The model's version policy: ``override`` (MODEL_VERSION_POLICY's entry), else its config.json's,
    else the newest version only."""
    if override is not None:
        return VersionPolicy.parse(override)
    config = folder / CONFIG
    if not config.is_file():
        return VersionPolicy()
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise VersionPolicyError(f"{CONFIG} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or "version_policy" not in raw:
        return VersionPolicy()
    return VersionPolicy.parse(raw["version_policy"])
