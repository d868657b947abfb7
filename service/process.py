"""The split service's processes die with their parent: no engine or front end outlives the service; and
whether a process at the other end of a socket still lives."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PARENT_PID = "TSERVE_PARENT_PID"  # in a child's environment: the pid of the process that started it


def die_with_parent(sig: signal.Signals = signal.SIGTERM, parent: int | None = None) -> None:
    """Have the kernel send this process ``sig`` when its parent dies (Linux's ``PR_SET_PDEATHSIG``; a
    no-op elsewhere). Call it first thing in the child: never as a ``preexec_fn``, which is not safe in a
    parent with threads (the child may deadlock between fork and exec). With ``parent``, the pid that
    started this process: if it died before the call, this process exits at once (no signal would come)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:
        os._exit(0)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
