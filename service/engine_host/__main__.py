"""``python -m service.engine_host FOLDER``: the split service's engine process (``FRONTENDS`` >= 1).

Started by ``service/supervisor.py`` with the service's environment. It loads the models as one process
would (``ModelHost.open``: the repository, the memory budget, the poller), warms them up, and serves the
front ends over the sockets in FOLDER (``server.py``). SIGTERM (sent once the front ends have drained)
lets the work in flight finish within SHUTDOWN_TIMEOUT_S, then stops the models and exits 0. It dies
with its parent (``PR_SET_PDEATHSIG``), so no engine outlives the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from service import gc_tuning
from service.engine import runtime
from service.engine_host.server import EngineServer
from service.models.host import ModelHost
from service.observe.logs import configure_logging
from service.observe.metrics import Metrics
from service.observe.tracing import Tracing
from service.process import PARENT_PID, die_with_parent
from service.settings import Settings

log = logging.getLogger("service.engine")


async def serve(settings: Settings, folder: Path) -> None:
    metrics = Metrics.from_settings(settings)
    tracing = Tracing.from_environment(lambda reason, count: metrics.spans_dropped.labels(reason).inc(count))
    host = await ModelHost.open(settings, metrics)
    server = EngineServer(host, folder)
    server.bind()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await host.start(settings.warmup)
    gc_tuning.settle(settings.gc_threshold)
    log.info(
        "engine ready: %d model(s) serving (%s)",
        len(host.registry.pipelines),
        ", ".join(host.registry.pipelines),
    )
    serving = asyncio.ensure_future(server.serve())
    await stopping.wait()
    log.info("engine stopping: the work in flight gets up to %.0fs", settings.shutdown_timeout_s)
    await host.stop(settings.shutdown_timeout_s)  # lets every batcher and sequence finish, then frees them
    await server.close()
    serving.cancel()
    tracing.shutdown()


def main() -> None:
    parent = os.environ.get(PARENT_PID)
    die_with_parent(parent=int(parent) if parent and parent.isdigit() else None)
    folder = Path(sys.argv[1])
    settings = Settings()
    configure_logging(settings)
    if settings.ort_thread_pool == "shared" and settings.intra_op_spinning and settings.model_instances == 1:
        runtime.use_shared_thread_pool(settings.intra_op_threads, settings.inter_op_threads)
    try:
        import uvloop

        uvloop.run(serve(settings, folder))
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(settings, folder))
    log.info("engine %d exits", os.getpid())


if __name__ == "__main__":
    main()
