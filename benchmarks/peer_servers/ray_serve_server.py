"""The fused classifier behind Ray Serve, batched with ``@serve.batch``: ``benchmarks/peers.py`` starts it.

    MODEL_DIR=models/bert-classifier PORT=8002 MAX_BATCH_SIZE=32 BATCH_TIMEOUT_MS=0 \
        .venv-peers/bin/python benchmarks/peer_servers/ray_serve_server.py

A local Ray cluster (GCS, raylet, workers) with Serve's HTTP proxy actor on PORT and one replica of
the deployment. The replica tokenizes each request in ``__call__`` (as the service does on its event
loop) and awaits ``classify``, which ``@serve.batch`` calls with up to ``max_batch_size`` requests
gathered for at most ``batch_wait_timeout_s`` after the first; the padded batch runs in a thread
(as the service's batcher runs the model off its event loop), so the replica keeps taking requests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # classifier.py, from any working directory

import numpy as np
import ray
from classifier import CLASSIFY_PATH, READY_PATH, Encoded, FusedClassifier, PeerSettings
from ray import serve
from ray.serve.schema import LoggingConfig
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

HERE = Path(__file__).resolve().parent
# Access logs off (one line per request otherwise), as the service's ACCESS_LOG is by default.
QUIET = LoggingConfig(log_level="WARNING", enable_access_log=False)


@serve.deployment(num_replicas=1, logging_config=QUIET)  # one model copy, as the service's WORKERS=1
class Classifier:
    def __init__(self, settings: PeerSettings) -> None:
        self.model = FusedClassifier.from_settings(settings)
        self.model.probabilities([self.model.encode("warm-up")])  # as the service warms up
        self.classify.set_max_batch_size(settings.max_batch_size)
        self.classify.set_batch_wait_timeout_s(settings.batch_timeout_s)

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path == READY_PATH:
            return Response(status_code=200)  # the replica is up: the proxy routes to it
        if request.method != "POST" or request.url.path != CLASSIFY_PATH:
            return Response(status_code=404)
        encoded = self.model.encode((await request.json())["text"])
        probs = await self.classify(encoded)
        return JSONResponse(self.model.answer(encoded, probs))

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.0)  # both set from the settings in __init__
    async def classify(self, batch: list[Encoded]) -> list[np.ndarray]:
        return list(await asyncio.to_thread(self.model.probabilities, batch))


def main() -> None:
    settings = PeerSettings.from_env()
    print(
        f"Ray Serve {ray.__version__}: {settings.model_dir.name}, max_batch_size {settings.max_batch_size}, "
        f"batch_wait_timeout {settings.batch_timeout_s * 1000:g} ms, intra-op threads {settings.intra_op_threads}",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # through `finally`: Serve and Ray shut down
    # Ray's workers (the replica) import classifier.py too: they inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 * 1024**2,  # responses are small: no need for Ray's 30% of RAM
    )
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port}, logging_config=QUIET)
        # Up to 4 batches waiting per replica: Serve's default (5) would hold the rest at the proxy.
        app = Classifier.options(max_ongoing_requests=4 * settings.max_batch_size).bind(settings)
        serve.run(app, name="classifier", route_prefix="/")
        signal.pause()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
