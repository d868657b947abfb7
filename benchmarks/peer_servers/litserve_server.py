"""The fused classifier behind LitServe, with its own dynamic batching: ``benchmarks/peers.py`` starts it.

    MODEL_DIR=models/bert-classifier PORT=8001 MAX_BATCH_SIZE=32 BATCH_TIMEOUT_MS=2 \
        .venv-peers/bin/python benchmarks/peer_servers/litserve_server.py

LitServe's layout: one uvicorn API-server process (HTTP and JSON) hands each request over a queue to
one inference-worker process, which collects up to ``max_batch_size`` requests for ``batch_timeout``
seconds and runs the hooks below on them: ``decode_request`` per request (tokenize), ``batch``,
``predict`` (the padded batch through ONNX Runtime, softmax), ``unbatch``, ``encode_response``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # classifier.py, from any working directory

import litserve as ls
import numpy as np
from classifier import CLASSIFY_PATH, READY_PATH, Encoded, FusedClassifier, PeerSettings


class ClassifierAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.model = FusedClassifier.from_settings(PeerSettings.from_env())
        self.model.probabilities([self.model.encode("warm-up")])  # as the service warms up

    def decode_request(self, request) -> Encoded:  # type: ignore[no-untyped-def]
        # Unannotated on purpose: LitServe reads the annotation as the body's schema (a dict would be a
        # query parameter); without one the body is parsed as JSON, a dict.
        return self.model.encode(request["text"])

    def batch(self, inputs: list[Encoded]) -> list[Encoded]:
        return inputs

    def predict(self, batch: list[Encoded]) -> list[tuple[Encoded, np.ndarray]]:
        return list(zip(batch, self.model.probabilities(batch), strict=True))

    def unbatch(self, output: list[tuple[Encoded, np.ndarray]]) -> list[tuple[Encoded, np.ndarray]]:
        return output

    def encode_response(self, output: tuple[Encoded, np.ndarray]) -> dict[str, Any]:
        return self.model.answer(*output)


def main() -> None:
    settings = PeerSettings.from_env()
    api = ClassifierAPI(
        max_batch_size=settings.max_batch_size,
        batch_timeout=settings.batch_timeout_s,
        api_path=CLASSIFY_PATH,
    )
    server = ls.LitServer(
        api,
        accelerator="cpu",
        workers_per_device=1,  # one model copy, as the service's WORKERS=1
        healthcheck_path=READY_PATH,  # 200 once the worker's setup is done
        # ZMQ between API server and worker instead of multiprocessing queues (benchmarks/README.md, "Peers")
        fast_queue=os.environ.get("LITSERVE_FAST_QUEUE", "1") == "1",
    )
    print(
        f"LitServe {ls.__version__}: {settings.model_dir.name}, max_batch_size {settings.max_batch_size}, "
        f"batch_timeout {settings.batch_timeout_s * 1000:g} ms, fast_queue {server.use_zmq}, "
        f"intra-op threads {settings.intra_op_threads}",
        flush=True,
    )
    server.run(
        host=settings.host,
        port=settings.port,
        num_api_servers=1,
        log_level="warning",
        generate_client_file=False,
    )


if __name__ == "__main__":
    main()
