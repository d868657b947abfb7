"""Print requirement lines from pyproject.toml, so an image installs its dependencies before the source.

    python requirements.py PYPROJECT SECTION...

A SECTION is ``base`` (``[project] dependencies``), an extra's name (``export``, ``load``), or
``SECTION:NAME,NAME`` for only those packages of it (``base:numpy,pillow``). Installing from these
lines in a layer of its own keeps that layer cached until pyproject.toml changes.
Standard library only (tomllib: Python 3.11+).
"""

from __future__ import annotations

import re
import sys
import tomllib


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"cannot read a package name from {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: dict, section: str) -> list[str]:
    project = pyproject["project"]
    group, _, only = section.partition(":")
    if group == "base":
        lines = list(project.get("dependencies", []))
    else:
        extras = project.get("optional-dependencies", {})
        if group not in extras:
            raise SystemExit(f"pyproject.toml has no extra {group!r} (extras: {', '.join(sorted(extras))})")
        lines = list(extras[group])
    if only:
        wanted = {_name(name) for name in only.split(",")}
        lines = [line for line in lines if _name(line) in wanted]
        missing = wanted - {_name(line) for line in lines}
        if missing:
            raise SystemExit(f"section {group!r} of pyproject.toml lists no {', '.join(sorted(missing))}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    with open(argv[0], "rb") as f:
        pyproject = tomllib.load(f)
    for section in argv[1:]:
        for line in requirements(pyproject, section):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
