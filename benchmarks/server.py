"""The server a benchmark measures: ``python -m service`` (or a probe of it) with the benchmark's options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.options import Options
from harness.service_process import ServiceProcess


def benchmark_server(
    repository: Path,
    opts: Options,
    env: Mapping[str, str | None] | None = None,
    command: Sequence[str] | None = None,
    log_level: str = "warning",
    cpu_of_tree: bool = False,
    port: int | None = None,
    ready_path: str = "/health/ready",
) -> ServiceProcess:
    """One worker on ``repository`` with the options' device and threads; ``env`` adds settings.

    Not started: ``with benchmark_server(...) as server`` starts it (or ``.start()``, which also times
    spawn -> ready in ``ready_s``). ``command`` replaces ``python -m service`` (serve_probe.py).
    ``cpu_of_tree``: the CPU figures count the processes it starts too (as a peer server's must).
    ``port``: default, a free one.
    """
    return ServiceProcess(
        {
            "MODEL_REPOSITORY": str(repository),
            "WORKERS": "1",
            "LOG_LEVEL": log_level,
            "DEVICE": opts.device,
            "INTRA_OP_THREADS": str(opts.threads),
            "INTER_OP_THREADS": "1",
            **opts.extra.get("server_env", {}),  # a plan's settings for every server it starts (gpu.py)
            **(env or {}),
        },
        command=command,
        cpu_of_tree=cpu_of_tree,
        port=port,
        ready_path=ready_path,
    )


def providers(server: ServiceProcess) -> str:
    """The execution providers the loaded models really run on (from /v1/models)."""
    try:
        models = server.get_json("/v1/models")["data"]
    except (OSError, ValueError, KeyError):
        return "unknown"
    return ", ".join(sorted({m.get("execution_provider", "?") for m in models}))
