"""podman in the project's private state: the environment, a podman command, a build by scripts/podman_build.sh.

scripts/podman_build.sh keeps every image, container, network and volume it and the tests make under
PODMAN_STATE (<cache>/podman by default, outside the clone: harness/cache.py), with its own containers.conf and storage.conf; ``env()`` points
podman at that state and never at the machine's own.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

from harness.cache import cache_root

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "scripts" / "podman_build.sh"
TOOLS = ("podman", "buildah", "runc", "mmdebstrap")


@functools.cache
def _state() -> dict[str, str]:
    """The build script's CONTAINERS_CONF and CONTAINERS_STORAGE_CONF, asked once per process (the health
    ticker runs podman every second)."""
    out = subprocess.run([str(BUILD), "env"], capture_output=True, text=True, check=True, cwd=REPO)
    state = dict(item.partition("=")[::2] for item in out.stdout.split()[1:])  # "export A=x B=y"
    if not state["CONTAINERS_CONF"].startswith(str(cache_root())) and "PODMAN_STATE" not in os.environ:
        raise RuntimeError("podman_build.sh env named a containers.conf outside the project's cache")
    return state


def env() -> dict[str, str]:
    """This process's environment plus the private containers.conf and storage.conf of the build script."""
    return {**os.environ, **_state()}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` in the private state; raises CalledProcessError (with its stderr) when ``check``."""
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=env(), timeout=timeout, check=check
    )


def missing_tools(*extra: str) -> list[str]:
    return [tool for tool in (*TOOLS, *extra) if shutil.which(tool) is None]


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
