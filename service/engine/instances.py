"""Which of a model's instances the current compute thread runs (``MODEL_INSTANCES``).

With N instances, each graph of a batched model has N ONNX Runtime sessions, the intra-op threads split
between them (``runtime._instance_options``), and the model's batcher N compute threads that run N
batches at once: thread i runs session i, as Triton's ``instance_group`` does on CPU. The thread's index
is set once, when the batcher's executor starts the thread (``binder``); ``Graph.session`` reads it. A
thread no batcher started (the event loop, a benchmark, a test) runs instance 0.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable

_slot = threading.local()


def current() -> int:
    """The index of the instance the calling thread runs (0 outside a batcher's compute threads)."""
    return getattr(_slot, "index", 0)


def binder() -> Callable[[], None]:
    """A ``ThreadPoolExecutor`` initializer: each thread it starts runs the next instance (0, 1, ...)."""
    indices = itertools.count()  # next() on a count is atomic under the GIL

    def bind() -> None:
        _slot.index = next(indices)

    return bind


def threads_each(intra_op_threads: int, instances: int) -> int:
    """Intra-op threads of each of ``instances`` sessions sharing ``intra_op_threads`` (0: every core the
    process may use, as ONNX Runtime's own default), at least 1."""
    total = intra_op_threads or len(os.sched_getaffinity(0))
    return max(1, total // max(1, instances))
