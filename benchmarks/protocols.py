"""(g) Protocol overhead: the OpenAI and Open Inference Protocol v2 routes vs the native ones, same server.

One real service with the text classifier and the GPT. For each workload, closed-loop clients send
the same inputs through each door in turn, interleaved for ``--rounds`` rounds so a drifting machine
drifts for all of them alike:

- classify, 32 clients, one SST-2 sentence a request: ``POST /v1/classify``; ``POST
  /v2/models/<clf>/infer`` with JSON tensors; the same with binary tensors (tritonclient's default).
- generate, 8 clients, greedy, the same prompt and length: ``POST /v1/generate``;
  ``POST /v1/completions``; ``POST /v2/models/<gpt>/generate``.

Every request bypasses the response cache (``Cache-Control: no-cache, no-store``). The headline is
each protocol's throughput over the native route's (target >= 0.9): what the protocol layer costs.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/protocols.py` anywhere

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import ratio

NAME = "protocols"
TITLE = "(g) Protocol overhead: OpenAI and Open Inference Protocol v2 routes vs native"
TARGET = 0.9
CLASSIFY_CLIENTS = 32
GENERATE_CLIENTS = 8
PROMPT = "ROMEO:\nWhat light through yonder window"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per point (default 4, quick 0.5)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per generation (default 32)")


def _binary_infer_body(text: str) -> tuple[bytes, dict[str, str]]:
    """One BYTES input as the binary tensor extension sends it: JSON header, then a length-prefixed element."""
    data = text.encode()
    element = struct.pack("<I", len(data)) + data
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(element)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + element, {"Inference-Header-Content-Length": str(len(header)), **BYPASS_CACHE}


def _request(path: str, body: Callable[[int], Any], headers: Callable[[int], dict[str, str]]) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        response = await conn.request("POST", path, body(i), headers(i))
        return response.status, {}

    return request


def classify_doors(texts: list[str], model: str) -> dict[str, RequestFn]:
    binary = [_binary_infer_body(t) for t in texts]
    return {
        "native /v1/classify": _request(
            "/v1/classify", lambda i: {"text": texts[i % len(texts)]}, lambda i: BYPASS_CACHE
        ),
        "v2 infer, JSON tensors": _request(
            f"/v2/models/{model}/infer",
            lambda i: {
                "inputs": [
                    {"name": "text", "shape": [1], "datatype": "BYTES", "data": [texts[i % len(texts)]]}
                ]
            },
            lambda i: BYPASS_CACHE,
        ),
        "v2 infer, binary tensors": _request(
            f"/v2/models/{model}/infer",
            lambda i: binary[i % len(binary)][0],
            lambda i: binary[i % len(binary)][1],
        ),
    }


def generate_doors(model: str, new_tokens: int) -> dict[str, RequestFn]:
    greedy = {"temperature": 0}
    return {
        "native /v1/generate": _request(
            "/v1/generate",
            lambda i: {"prompt": PROMPT, "max_new_tokens": new_tokens, **greedy},
            lambda i: BYPASS_CACHE,
        ),
        "OpenAI /v1/completions": _request(
            "/v1/completions",
            lambda i: {"model": model, "prompt": PROMPT, "max_tokens": new_tokens, **greedy},
            lambda i: BYPASS_CACHE,
        ),
        "v2 generate": _request(
            f"/v2/models/{model}/generate",
            lambda i: {"text_input": PROMPT, "parameters": {"max_tokens": new_tokens, **greedy}},
            lambda i: BYPASS_CACHE,
        ),
    }


def measure(
    server: ServiceProcess, doors: dict[str, RequestFn], clients: int, rounds: int, duration: float
) -> dict[str, LoadPoint]:
    found: dict[str, list[LoadPoint]] = {name: [] for name in doors}
    for _ in range(rounds):
        for name, request in doors.items():
            found[name].append(run_async(closed_loop(server, clients, request, duration_s=duration)))
    return {name: merge_points(points) for name, points in found.items()}


def _table(workload: str, clients: int, points: dict[str, LoadPoint]) -> list[str]:
    native = next(iter(points.values()))
    rows = [
        f"**{workload}**, {clients} closed-loop clients",
        "",
        "| route | requests/s | vs native | p50 ms | p99 ms | errors | server cores | client cores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, p in points.items():
        rows.append(
            f"| {name} | {p.rps:.1f} | {ratio(p.rps, native.rps):.2f} | {p.p(50) * 1e3:.1f} | {p.p(99) * 1e3:.1f} | "
            f"{p.errors} | {cores_used(p.server_cpu_s, p.seconds)} | {cores_used(p.client_cpu_s, p.seconds)} |"
        )
    return [*rows, ""]


def run(opts: Options) -> Result:
    classifier = find_model(opts.models, "text-classification")
    gpt = find_model(opts.models, "text-generation")
    duration = opts.extra.get("duration") or (0.5 if opts.quick else 4.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 2)
    new_tokens = opts.extra.get("new_tokens") or (8 if opts.quick else 32)
    texts = sentiment_texts()
    with subset_repository([classifier, gpt]) as repo, benchmark_server(repo, opts) as server:
        provider = providers(server)
        classify = measure(server, classify_doors(texts, classifier.name), CLASSIFY_CLIENTS, rounds, duration)
        generate = measure(server, generate_doors(gpt.name, new_tokens), GENERATE_CLIENTS, rounds, duration)

    native_classify, native_generate = classify["native /v1/classify"], generate["native /v1/generate"]
    metrics: dict[str, object] = {
        "oip_json_over_native_classify": ratio(classify["v2 infer, JSON tensors"].rps, native_classify.rps),
        "oip_binary_over_native_classify": ratio(
            classify["v2 infer, binary tensors"].rps, native_classify.rps
        ),
        "openai_over_native_generate": ratio(generate["OpenAI /v1/completions"].rps, native_generate.rps),
        "oip_over_native_generate": ratio(generate["v2 generate"].rps, native_generate.rps),
        "native_classify_rps": native_classify.rps,
        "native_generate_rps": native_generate.rps,
    }
    checks = [
        Check(
            "OIP v2 infer (binary) / native, classify",
            float(metrics["oip_binary_over_native_classify"]),
            TARGET,
        ),  # type: ignore[arg-type]
        Check(
            "OIP v2 infer (JSON) / native, classify", float(metrics["oip_json_over_native_classify"]), TARGET
        ),  # type: ignore[arg-type]
        Check("OpenAI completions / native, generate", float(metrics["openai_over_native_generate"]), TARGET),  # type: ignore[arg-type]
        Check("OIP v2 generate / native, generate", float(metrics["oip_over_native_generate"]), TARGET),  # type: ignore[arg-type]
    ]
    details = [
        *_table("classify", CLASSIFY_CLIENTS, classify),
        *_table(f"generate (greedy, {new_tokens} new tokens)", GENERATE_CLIENTS, generate),
        f"Each point {duration:g} s after a 0.5 s warm-up, {rounds} interleaved round(s) per route, merged; "
        "every request bypasses the response cache.",
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
