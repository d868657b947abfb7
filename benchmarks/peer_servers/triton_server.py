"""The fused classifier behind NVIDIA Triton (PyTriton), with Triton's dynamic batcher: ``benchmarks/peers.py``
starts it.

    MODEL_DIR=models/bert-classifier PORT=8001 MAX_BATCH_SIZE=32 BATCH_TIMEOUT_MS=0.1 \
        .venv-triton/bin/python benchmarks/peer_servers/triton_server.py

PyTriton's layout: the ``tritonserver`` binary its wheel carries (HTTP and gRPC front ends, the dynamic
batcher, its Python backend) runs as a child of this process; each batch the batcher forms goes from the
backend's stub process to this one over ZeroMQ, where ``infer`` runs: tokenize the texts, the padded
batch through ONNX Runtime, softmax, the top label and its score back as two outputs. Clients speak
Triton's HTTP/REST protocol (KServe v2): ``POST /v2/models/<model>/infer`` with a BYTES ``text`` input
of shape [1, 1]; readiness is ``/v2/models/<model>/ready``. ``TRITON_INSTANCES`` (default 1) binds that
many copies of the model, Triton's ``instance_group`` count, each with its own ONNX Runtime session;
``TRITON_PREFERRED_BATCH`` (``8,16,32``, say) sets the batcher's preferred batch sizes (default none).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # classifier.py, from any working directory

import numpy as np
from classifier import FusedClassifier, PeerSettings
from pytriton import __version__ as pytriton_version
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

READY_PATH = "/v2/health/ready"


def infer_path(model: str) -> str:
    return f"/v2/models/{model}/infer"


def make_infer(model: FusedClassifier):  # type: ignore[no-untyped-def]
    @batch
    def infer(text: np.ndarray) -> dict[str, np.ndarray]:  # text: (B, 1) of bytes
        encoded = [model.encode(t.decode("utf-8")) for t in text[:, 0]]
        probs = model.probabilities(encoded)  # (B, labels) float64
        best = np.argmax(probs, axis=-1)
        labels = np.array([[model.labels[b].encode()] for b in best], dtype=np.object_)
        scores = probs[np.arange(len(best)), best].astype(np.float64)[:, None]
        return {"label": labels, "score": scores}

    return infer


def python_library_first() -> None:
    """Put this Python's own libpython first on the library path of Triton's children: its Python backend
    stub otherwise loads the first libpython3.x the loader finds (Debian's 3.11.2 here, under a 3.11.7
    venv), whose standard library then fails in multiprocessing ('_thread.RLock' object has no attribute
    '_recursion_count')."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")])
        )


def main() -> None:
    python_library_first()
    settings = PeerSettings.from_env()
    instances = int(os.environ.get("TRITON_INSTANCES", "1"))
    models = [FusedClassifier.from_settings(settings) for _ in range(instances)]
    for model in models:
        model.probabilities([model.encode("warm-up")])  # as the service warms up
    name = models[0].name
    delay_us = round(settings.batch_timeout_s * 1e6)
    preferred = [int(b) for b in os.environ.get("TRITON_PREFERRED_BATCH", "").split(",") if b] or None
    config = TritonConfig(
        http_address=settings.host,
        http_port=settings.port,
        grpc_address="127.0.0.1",
        grpc_port=int(os.environ.get("PEER_GRPC_PORT", "0")) or settings.port + 1,
        metrics_port=int(os.environ.get("PEER_METRICS_PORT", "0")) or settings.port + 2,
        allow_metrics=False,
        log_verbose=0,
    )
    print(
        f"Triton (PyTriton {pytriton_version}): {name}, max_batch_size {settings.max_batch_size}, "
        f"max_queue_delay {delay_us} us, preferred batch sizes {preferred or 'none'}, {instances} instance(s), "
        f"intra-op threads {settings.intra_op_threads}",
        flush=True,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=name,
            infer_func=[make_infer(m) for m in models],
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[
                Tensor(name="label", dtype=bytes, shape=(1,)),
                Tensor(name="score", dtype=np.float64, shape=(1,)),
            ],
            config=ModelConfig(
                max_batch_size=settings.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us, preferred_batch_size=preferred),
            ),
            strict=True,
        )
        triton.serve()


if __name__ == "__main__":
    main()
