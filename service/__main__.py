"""``python -m service``: run the API with uvicorn, configured by the environment (see service.settings).

SIGTERM (or Ctrl-C) drains first: readiness turns 503, new requests get 503
with Retry-After, requests in flight (streams included) get up to
SHUTDOWN_TIMEOUT_S to finish, then the process exits 0 (``service.lifecycle``).

With WORKERS > 1 uvicorn starts that many processes from the import string
``service.app:create_app`` (a factory), so each worker loads its own models
and reads the same environment; their metrics are aggregated through
prometheus_client's multiprocess mode in PROMETHEUS_MULTIPROC_DIR (a fresh
temporary directory unless one is given).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from service.http_server import uvicorn_config
from service.observe.logs import json_log_config
from service.settings import OWN_PROCESS_FLAG, SHARED_POOL_FLAG, Settings


def refuse_split_quotas(settings: Settings) -> None:
    """With WORKERS > 1 (or FRONTENDS > 1) and no REDIS_URL each process would count a key's limits on its
    own (a key would get that many times its entitlement): refuse to start, saying what to set."""
    processes = max(settings.workers, settings.frontends)
    if processes <= 1 or settings.redis_url or settings.api_keys_file is None:
        return
    from service.access.quotas import load_keys_file

    limited = [
        e.id for e in load_keys_file(settings.api_keys_file) if e.requests_per_minute or e.tokens_per_minute
    ]
    if limited:
        what = f"WORKERS={settings.workers}" if settings.workers > 1 else f"FRONTENDS={settings.frontends}"
        raise SystemExit(
            f"API_KEYS_FILE gives keys {', '.join(limited)} limits, and {what} without REDIS_URL would count "
            f"them in each process apart (each key would get {processes} times its limit): set REDIS_URL (the "
            "quotas then live in Redis, shared by every process and replica), or run one process"
        )


def main() -> None:
    settings = Settings()
    refuse_split_quotas(settings)
    os.environ[OWN_PROCESS_FLAG] = "1"  # this process (and its workers) is the service's: see gc_tuning.py
    if settings.ort_thread_pool == "shared" and settings.intra_op_spinning and settings.model_instances == 1:
        # This process owns ONNX Runtime: one thread pool for all its sessions (service.engine.runtime).
        # uvicorn's worker processes (WORKERS > 1) inherit the environment and do the same in create_app.
        # Several instances of a model need pools of their own, each its share of the threads (ONNX
        # Runtime refuses sessions with their own pool once its global one exists).
        os.environ[SHARED_POOL_FLAG] = "1"
    made_dir = None
    if (settings.workers > 1 or settings.frontends) and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Before prometheus_client is imported anywhere: it picks its storage when first imported.
        made_dir = tempfile.mkdtemp(prefix="tserve-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = made_dir

    from service.app import create_app
    from service.lifecycle import GracefulServer, run_workers

    common: dict[str, Any] = dict(
        log_level=settings.log_level,
        # LOG_FORMAT=json: uvicorn's own lines go to the root handler too (logs.py), not to its text handlers.
        **({"log_config": json_log_config(settings)} if settings.log_format == "json" else {}),
        access_log=False,  # uvicorn's never: ours (ACCESS_LOG) has the request id and model (service.api.http.observe)
        timeout_graceful_shutdown=max(1, int(settings.shutdown_timeout_s)),
    )
    try:
        if settings.frontends:
            from service.supervisor import run_split

            config = uvicorn_config("service.app:create_app", settings, factory=True, **common)
            run_split(config, settings.frontends, settings.shutdown_timeout_s)
        elif settings.workers > 1:
            run_workers(
                uvicorn_config(
                    "service.app:create_app", settings, factory=True, workers=settings.workers, **common
                )
            )
        else:
            GracefulServer(uvicorn_config(create_app(settings), settings, **common)).run()
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
