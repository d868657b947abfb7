"""The fused classifier behind Seldon MLServer, with its adaptive batching: ``benchmarks/peers.py`` starts it.

    MODEL_DIR=models/bert-classifier PORT=8001 MAX_BATCH_SIZE=32 BATCH_TIMEOUT_MS=1 \
        .venv-mlserver/bin/python benchmarks/peer_servers/mlserver_server.py

MLServer's layout: ``mlserver start`` on a folder with a ``settings.json`` (ports, ``parallel_workers``)
and, per model, a ``model-settings.json`` (the runtime class, ``max_batch_size``, ``max_batch_time``);
this script writes both into a temporary folder and execs it. Its adaptive batcher stacks up to
``max_batch_size`` requests along their first axis, waiting at most ``max_batch_time`` seconds, and
hands the batch to the custom runtime (``mlserver_runtime.py``): tokenize, the padded batch through ONNX
Runtime, softmax, the top label and its score. ``MLSERVER_WORKERS`` is ``parallel_workers`` (default 0:
inference in the server's own process; n > 0 runs it in n worker processes, each with its own model).
Clients speak KServe v2 (``POST /v2/models/<model>/infer``, a BYTES ``text`` input of shape [1, 1]);
readiness is ``/v2/health/ready``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # classifier.py, from any working directory

from classifier import PeerSettings  # noqa: E402 (after the path)


def main() -> None:
    settings = PeerSettings.from_env()
    workers = int(os.environ.get("MLSERVER_WORKERS", "0"))
    name = settings.model_dir.name
    folder = Path(tempfile.mkdtemp(prefix="mlserver-peer-"))
    (folder / "settings.json").write_text(
        json.dumps(
            {
                "host": settings.host,
                "http_port": settings.port,
                "grpc_port": int(os.environ.get("PEER_GRPC_PORT", "0")) or settings.port + 1,
                "metrics_port": int(os.environ.get("PEER_METRICS_PORT", "0")) or settings.port + 2,
                "parallel_workers": workers,
                "debug": False,
            }
        )
    )
    model = folder / name
    model.mkdir()
    (model / "model-settings.json").write_text(
        json.dumps(
            {
                "name": name,
                "implementation": "mlserver_runtime.FusedClassifierRuntime",
                "max_batch_size": settings.max_batch_size,
                "max_batch_time": settings.batch_timeout_s,
            }
        )
    )
    print(
        f"MLServer {version('mlserver')}: {name}, max_batch_size {settings.max_batch_size}, max_batch_time "
        f"{settings.batch_timeout_s * 1000:g} ms, parallel_workers {workers}, intra-op threads "
        f"{settings.intra_op_threads}",
        flush=True,
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    mlserver = Path(sys.executable).with_name("mlserver")
    os.execve(mlserver, [str(mlserver), "start", str(folder)], env)


if __name__ == "__main__":
    main()
