"""Python's garbage collector, set for a server: what start-up built is frozen out of it, and young objects
are collected every GC_THRESHOLD allocations instead of Python's 700.

A request allocates a few hundred container objects and leaves almost none in reference cycles (0.3 a
request were collected, on the fake engine); with Python's default threshold a collection of the young
generation ran every second request, and each older-generation pass walked everything start-up had made
(the tokenizers', Litestar's, pydantic's and ONNX Runtime's Python objects). ``gc.freeze()`` once the
models are loaded moves those to a generation the collector never walks, as vLLM and Instagram do, and a
higher first threshold runs the young collection about fourteen times less often. Measured with the
fake engine, in process, one-text classify (benchmarks/README.md, "The request path"): 0.83x the CPU of
a request. Objects in cycles live a little longer before they are freed: at most GC_THRESHOLD
allocations' worth.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def settle(threshold: int) -> None:
    """Once start-up is done: collect, freeze what survived, and set the first threshold (0: Python's)."""
    gc.collect()
    gc.freeze()
    if threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(threshold, gen1, gen2)
    log.info(
        "garbage collector: %d start-up objects frozen, thresholds %s",
        gc.get_freeze_count(),
        gc.get_threshold(),
    )
