"""``python -m service`` with one probe: every batch the text classifier runs is logged (its token ids).

Used by overhead.py, which replays exactly those batches in process to compare against ONNX Runtime
without the service. The probe wraps ``TextClassifier.run_batch`` before the app is built: one JSON
line per model call (a sub-batch after the length split), written from the model's worker thread.
Everything else is the real service, configured by the same environment variables.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

import numpy as np

from service.__main__ import main
from service.pipelines.classify import TextClassifier

_log = open(os.environ["BENCH_BATCH_LOG"], "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (process-long)
_lock = threading.Lock()
_run_batch = TextClassifier.run_batch


def _logged_run_batch(self: TextClassifier, items: list[list[int]]) -> Sequence[np.ndarray]:
    with _lock:
        _log.write(json.dumps(items) + "\n")
    return _run_batch(self, items)


TextClassifier.run_batch = _logged_run_batch  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
