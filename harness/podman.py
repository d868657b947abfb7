"""podman in the project's private state: the environment, a podman command, a build by scripts/podman_build.sh.

scripts/podman_build.sh keeps every image, container, network and volume it and the tests make under
PODMAN_STATE (.cache/podman by default), with its own containers.conf and storage.conf; ``env()`` points
podman at that state and never at the machine's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "scripts" / "podman_build.sh"
TOOLS = ("podman", "buildah", "runc", "mmdebstrap")


def env() -> dict[str, str]:
    """This process's environment plus the private containers.conf and storage.conf of the build script."""
    out = subprocess.run([str(BUILD), "env"], capture_output=True, text=True, check=True, cwd=REPO)
    environment = dict(os.environ)
    for item in out.stdout.split()[1:]:  # "export A=x B=y"
        key, _, value = item.partition("=")
        environment[key] = value
    if not environment["CONTAINERS_CONF"].startswith(str(REPO)) and "PODMAN_STATE" not in os.environ:
        raise RuntimeError("podman_build.sh env named a containers.conf outside the repository")
    return environment


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` in the private state; raises CalledProcessError (with its stderr) when ``check``."""
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=env(), timeout=timeout, check=check
    )


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class BuildFailed(RuntimeError):
    pass


def build(*args: str, timeout: float = 3000) -> float:
    """``scripts/podman_build.sh ARGS``; the seconds it took. Raises BuildFailed with the log's tail."""
    started = time.perf_counter()
    result = subprocess.run(
        [str(BUILD), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise BuildFailed(f"podman_build.sh {' '.join(args)}:\n{result.stderr[-6000:]}")
    return time.perf_counter() - started
