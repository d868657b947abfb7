"""Child processes of a harness: stopping a whole process group, dying with the parent, CPU time from /proc."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM this child when the thread that started it dies (Linux; a no-op elsewhere).

    For children that must not outlive a harness killed with SIGKILL. Only from the main thread: the
    signal comes when the starting *thread* ends.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process_group(proc: subprocess.Popen[Any] | None, grace_s: float) -> bool:
    """SIGTERM the process group ``proc`` leads (``start_new_session=True``), SIGKILL it after ``grace_s``.

    The group, so that workers the process started stop with it. ``grace_s`` 0 kills at once.
    Returns False when it had to kill, True otherwise (also when the process was already gone).
    """
    if proc is None:
        return True
    if grace_s > 0 and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
            return True
        except subprocess.TimeoutExpired:
            pass
    killed = proc.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # also workers left behind by a leader that has exited
    proc.wait(timeout=30)
    return not killed


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc; NaN when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return math.nan
    if len(fields) < 13:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces), or None when gone."""
    return _stat_fields_of(Path(f"/proc/{pid}/stat"))


def _all_stats() -> dict[int, list[str]]:
    """Every live process's /proc/PID/stat fields (after its name), by pid."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            stats[int(entry.name)] = fields
    return stats


def _tree(pid: int, stats: dict[int, list[str]]) -> list[int]:
    """``pid`` and its descendants among ``stats`` (empty when ``pid`` is gone)."""
    if pid not in stats:
        return []
    children: dict[int, list[int]] = {}
    for process, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(process)
    tree, frontier = [pid], [pid]
    while frontier:
        found = children.get(frontier.pop(), [])
        tree += found
        frontier += found
    return tree


def _name(path: Path) -> str:
    try:
        return (path / "comm").read_text().strip()
    except OSError:
        return "?"


@dataclass(frozen=True)
class ThreadCPU:
    pid: int
    process: str  # the process's name (comm)
    thread: str  # the thread's own name (comm): a Python thread's is its process's
    seconds: float  # user + system CPU time so far


def thread_cpu(pid: int) -> dict[int, ThreadCPU]:
    """Every thread of a process tree by thread id, with its CPU time so far: where a server's cores go,
    thread by thread (diff two readings; a thread that ended in between is not counted)."""
    found: dict[int, ThreadCPU] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for process in _tree(pid, _all_stats()):
        proc = Path(f"/proc/{process}")
        owner = _name(proc)
        with contextlib.suppress(OSError):
            for task in (proc / "task").iterdir():
                fields = _stat_fields_of(task / "stat")
                if fields is not None:
                    seconds = (int(fields[11]) + int(fields[12])) / tick
                    found[int(task.name)] = ThreadCPU(process, owner, _name(task), seconds)
    return found


def _stat_fields_of(path: Path) -> list[str] | None:
    try:
        fields = path.read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return fields if len(fields) >= 15 else None


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and all its descendants (children it has reaped included), from /proc.

    For servers that do their work in other processes than the one started: LitServe's inference
    worker, Ray's raylet, proxy and replicas. NaN when ``pid`` itself is gone.
    """
    stats = _all_stats()
    tree = _tree(pid, stats)
    if not tree:
        return math.nan
    # utime, stime, cutime, cstime: ticks, reaped children's included
    return sum(sum(int(f) for f in stats[p][11:15]) for p in tree) / os.sysconf("SC_CLK_TCK")
