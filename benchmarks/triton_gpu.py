"""(t) Triton through PyTriton and this service, on the same fp16 ONNX file on CUDA, driven by wrk.

The GPU counterpart of ``peers.py``'s Triton row: the classifier's ``fp16`` graph (what the service serves
on CUDA) behind this service (MODEL_VARIANT=fp16, DEVICE=cuda) and behind NVIDIA Triton through PyTriton
(``peer_servers/triton_server.py`` with PEER_VARIANT=fp16, PEER_DEVICE=cuda: Triton's C++ HTTP front end
and dynamic batcher, the batch run by ONNX Runtime's CUDA provider in PyTriton's Python process). Each server
in turn, one at a time: started, the peer benchmark's parity check first (the same 16 texts one by one,
labels and scores compared with the service's), then wrk at 32, 64 and 256 connections. Both speak KServe
v2 here (``POST /v2/models/<model>/infer``, the same text; the service's input is shape [1], Triton's [1, 1]
with its batch axis), so the protocol is the same work for both. Triton's venv (numpy < 2) is given by
``--triton-python``; ``scripts/gpu/device_run.py`` makes it from the carried wheels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/triton_gpu.py` anywhere

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.options import BENCH_DIR, Options
from benchmarks.peers import AGREEMENT_TEXTS, READY_TIMEOUT_S, V2_MODEL_READY, _agreement, _answers
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server, providers
from benchmarks.wrk_sweep import CONNECTIONS, sweep, wrk_binary
from harness.event_loop import run_async
from harness.ports import free_port_outside_ephemeral
from harness.service_process import ServiceProcess
from harness.stats import ratio

NAME = "triton_gpu"
TITLE = "(t) Triton (PyTriton) vs this service, the same fp16 ONNX file on CUDA, 32/64/256 connections (wrk)"
VARIANT = "fp16"
TARGET_64 = 1.5  # the service's requests/s over Triton's at 64 connections (the goal)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--triton-python", type=Path, default=None, help="python of Triton's venv (numpy < 2)"
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds per point (default 5, quick 1)")
    parser.add_argument("--connections", type=int, nargs="+", default=None, help=f"default {CONNECTIONS}")
    parser.add_argument("--batch-timeout-ms", type=float, default=0.1, help="Triton's max_queue_delay (ms)")
    parser.add_argument("--variant", default=VARIANT, help="the graph both serve (default fp16)")


def skip_reason(opts: Options) -> str | None:
    python = opts.extra.get("triton_python")
    if python is None or not Path(python).is_file():
        return "no --triton-python (PyTriton's venv; the GPU run makes it from the carried wheels)"
    if wrk_binary() is None:
        return "wrk is not installed"
    return None


def v2_request(model: str, text: str, batch_axis: bool) -> tuple[str, bytes, dict[str, str]]:
    shape = [1, 1] if batch_axis else [1]
    body = {"inputs": [{"name": "text", "shape": shape, "datatype": "BYTES", "data": [text]}]}
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    return f"/v2/models/{model}/infer", json.dumps(body).encode(), headers


def run(opts: Options) -> Result:
    reason = skip_reason(opts)
    if reason is not None:
        sys.exit(f"error: {reason}")
    folder = find_model(opts.models, "text-classification")
    variant = opts.extra.get("variant") or VARIANT
    connections = opts.extra.get("connections") or ([8, 32] if opts.quick else list(CONNECTIONS))
    seconds = opts.extra.get("duration") or (1.0 if opts.quick else 5.0)
    threads = 1 if opts.quick else 4
    texts = sentiment_texts()
    sample = texts[:AGREEMENT_TEXTS]
    device = "cuda" if opts.device == "cuda" else "cpu"
    metrics: dict[str, object] = {"model": folder.name, "variant": variant, "duration_s": seconds}
    rows: dict[str, list[str]] = {}
    answers: dict[str, list[tuple[str, float]]] = {}
    ready: dict[str, float] = {}
    provider = "unknown"
    with subset_repository([folder]) as repo:
        servers: dict[str, ServiceProcess] = {
            "service": benchmark_server(
                repo, opts, env={"MODEL_VARIANT": variant, "CACHE_ENABLED": "false", "ACCESS_LOG": "false"}
            ),
            "triton": benchmark_server(
                repo,
                opts,
                env={
                    "MODEL_DIR": str(folder),
                    "PEER_VARIANT": variant,
                    "PEER_DEVICE": device,
                    "BATCH_TIMEOUT_MS": f"{opts.extra.get('batch_timeout_ms', 0.1):g}",
                    "MAX_BATCH_SIZE": "32",
                    "PEER_GRPC_PORT": str(free_port_outside_ephemeral()),
                    "PEER_METRICS_PORT": str(free_port_outside_ephemeral()),
                },
                command=[
                    str(opts.extra["triton_python"]),
                    str(BENCH_DIR / "peer_servers" / "triton_server.py"),
                ],
                cpu_of_tree=True,
                port=free_port_outside_ephemeral(),
                ready_path=V2_MODEL_READY.format(model=folder.name),
            ),
        }
        for key, server in servers.items():
            server.start(READY_TIMEOUT_S)
            try:
                ready[key] = server.ready_s
                if key == "service":
                    provider = providers(server)
                protocol = "v2" if key == "triton" else "classify"
                answers[key] = run_async(_answers(server, sample, protocol, folder.name))
                request = v2_request(folder.name, texts[0], batch_axis=key == "triton")
                rows[key] = sweep(
                    server, {key: request}, connections, seconds, threads, metrics, prefix=f"{key}_"
                )
            finally:
                server.close()
    agreement = _agreement(answers["service"], answers["triton"])
    metrics["agreement"] = agreement
    checks = []
    for c in connections:
        figure = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        over = ratio(figure[f"service_service_c{c}_rps"], figure[f"triton_triton_c{c}_rps"])
        metrics[f"service_over_triton_c{c}"] = over
        p99 = ratio(figure[f"service_service_c{c}_p99_ms"], figure[f"triton_triton_c{c}_p99_ms"])
        metrics[f"service_over_triton_p99_c{c}"] = p99
        if c == 64:
            checks.append(Check("this service / Triton, requests/s at 64 connections", over, TARGET_64))
            checks.append(Check("this service / Triton, p99 at 64 connections", p99, 1.0, False))
    details = [
        "| server | connections | requests/s | p50 ms | p99 ms | errors | server cores | wrk cores |",
        "|---|---|---|---|---|---|---|---|",
        *[row.replace(f"| {key} |", f"| {key} |", 1) for key in rows for row in rows[key]],
        "",
        f"`{folder.name}`'s `{variant}` graph on {device} in both; {AGREEMENT_TEXTS} texts one by one first: "
        f"Triton {agreement}. Ready after spawn: service {ready.get('service', 0):.1f} s, Triton "
        f"{ready.get('triton', 0):.1f} s. KServe v2 infer to both (the same text), wrk {threads} thread(s), "
        f"{seconds:g} s per point after a 1 s warm-up; Triton's max_queue_delay "
        f"{opts.extra.get('batch_timeout_ms', 0.1):g} ms, max batch 32 in both.",
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
