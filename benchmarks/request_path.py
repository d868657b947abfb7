"""(v) The request path alone: every door of the service on the fake engine, driven by wrk and h2load.

The service runs on ``benchmarks/fake_engine.py`` (sessions that compute nothing: correctly shaped
outputs, ``FAKE_SERVICE_MS`` per batch, 0 here), so what is measured is everything else a request
costs: HTTP, the ASGI layers, body decoding and validation, admission, the cache key (the response
cache is off, so every request reaches the engine), tokenization, the batcher's queue and futures,
metrics, post-processing and the answer. The server is pinned to core 0 (``taskset -c 0``, one
process, ``WORKERS=1``) and the load generator to core 1, so neither takes the other's time.

Doors, each a closed loop of ``--connections`` connections for ``--seconds``:

- REST ``/v1/classify``, one text and eight texts;
- Open Inference Protocol v2 ``/v2/models/bert-classifier/infer``, JSON tensors and binary tensors;
- OpenAI ``/v1/embeddings``;
- gRPC ``ModelInfer`` (KServe v2), driven by h2load with a framed protobuf request;
- ``/v1/generate`` streamed (Server-Sent Events), ``--tokens`` tokens a request: figures per token too.

For each: requests per second, p50 and p99 from the load generator, the load generator's own CPU (so
it is shown not to be the bottleneck: under one core), and the server's CPU per request in µs, from
``/proc`` (every process and thread of its tree), over the measured window only. The same doors are
measured on the baseline commit's service (``--baseline``; the code this issue started from) in the
same run, door by door, the two servers taking turns. Before the load, every door's answer is checked
(status, shape), so a door that answers wrongly fails the run rather than measuring an error path.

``--profile`` records the current server under the one-text REST load with py-spy and writes the top
functions (by own samples and by samples under them) to ``benchmarks/profiles/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/request_path.py` anywhere

import httpx

from benchmarks.cli import main
from benchmarks.options import BENCH_DIR, ROOT, Options
from benchmarks.results import Check, Result
from harness.ports import free_port
from harness.processes import process_tree_cpu_seconds
from harness.service_process import ServiceProcess
from harness.stats import percentile

NAME = "request_path"
TITLE = "(v) The request path alone: every door on the fake engine, server CPU per request"
BASELINE = (
    "5be0e02"  # the last commit before the request path was cut (issue: "a request that costs a quarter")
)
SERVED = "bert-classifier,bert-embedder,gpt"
TEXT = "a gripping , beautifully acted film that never loses its nerve"
PROFILES = BENCH_DIR / "profiles"
REST_CPU_GOAL_US = 300.0
TOKEN_CPU_GOAL_US = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=None, help="per door and server (default 10, quick 1)"
    )
    parser.add_argument("--connections", type=int, default=32, help="closed-loop connections (default 32)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per streamed generation (default 32)")
    parser.add_argument(
        "--baseline",
        default=None,
        help=f"the commit whose service is measured beside this one (default {BASELINE}; 'none': no baseline; "
        "quick: none)",
    )
    parser.add_argument("--doors", default="", help="comma-separated door names (default: every door)")
    parser.add_argument("--profile", action="store_true", help="py-spy profile of the one-text REST door")
    parser.add_argument(
        "--split",
        action="store_true",
        help="also the split service (FRONTENDS): its IPC cost (FRONTENDS=1 beside one process, both on core 0) "
        "and FRONTENDS=2 against 1 on both cores",
    )


# --- the doors --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Door:
    name: str
    label: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    grpc: bool = False
    tokens: int = 0  # a streamed generation: tokens per request
    check: Callable[[httpx.Response], None] = lambda r: None


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _v2_binary() -> tuple[bytes, dict[str, str]]:
    """The binary tensor extension: a JSON header, then the BYTES tensor as 4-byte lengths and bytes."""
    raw = TEXT.encode()
    tensor = struct.pack("<I", len(raw)) + raw
    header = _json(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(tensor)},
                }
            ],
            "outputs": [{"name": "label", "parameters": {"binary_data": True}}],
        }
    )
    return header + tensor, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def _grpc_frame() -> bytes:
    """One ModelInferRequest as gRPC frames it: a zero flag, the length (4 bytes, big-endian), the message."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="bert-classifier")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(TEXT.encode())
    message = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + message


def _expect(condition: bool, what: str, response: httpx.Response) -> None:
    if not condition:
        raise RuntimeError(f"{what}: {response.status_code} {response.text[:300]}")


def _classified(n: int) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        results = r.json().get("results", [])
        _expect(r.status_code == 200 and len(results) == n and "label" in results[0], "classify", r)

    return check


def _v2_json(r: httpx.Response) -> None:
    outputs = {o["name"]: o for o in r.json().get("outputs", [])}
    _expect(r.status_code == 200 and outputs.get("label", {}).get("shape") == [1], "v2 infer (JSON)", r)


def _v2_binary_check(r: httpx.Response) -> None:
    _expect(r.status_code == 200 and "Inference-Header-Content-Length" in r.headers, "v2 infer (binary)", r)


def _embeddings(r: httpx.Response) -> None:
    data = r.json().get("data", [])
    _expect(r.status_code == 200 and len(data) == 1 and len(data[0]["embedding"]) > 0, "embeddings", r)


def _streamed(tokens: int) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        events = [line for line in r.text.splitlines() if line.startswith("data:")]
        _expect(r.status_code == 200 and len(events) >= tokens, f"stream of {tokens} tokens", r)

    return check


def doors(tokens: int) -> list[Door]:
    binary, binary_headers = _v2_binary()
    v2_json = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [TEXT]}]}
    return [
        Door(
            "rest_classify_1",
            "REST classify, 1 text",
            "/v1/classify",
            _json({"text": TEXT}),
            check=_classified(1),
        ),
        Door(
            "rest_classify_8",
            "REST classify, 8 texts",
            "/v1/classify",
            _json({"texts": [TEXT] * 8}),
            check=_classified(8),
        ),
        Door(
            "v2_infer_json",
            "v2 infer, JSON",
            "/v2/models/bert-classifier/infer",
            _json(v2_json),
            check=_v2_json,
        ),
        Door(
            "v2_infer_binary",
            "v2 infer, binary",
            "/v2/models/bert-classifier/infer",
            binary,
            binary_headers,
            check=_v2_binary_check,
        ),
        Door(
            "openai_embeddings",
            "OpenAI embeddings",
            "/v1/embeddings",
            _json({"model": "bert-embedder", "input": TEXT}),
            check=_embeddings,
        ),
        Door(
            "grpc_infer",
            "gRPC ModelInfer",
            "/inference.GRPCInferenceService/ModelInfer",
            _grpc_frame(),
            grpc=True,
        ),
        Door(
            "generate_stream",
            f"REST generate, streamed ({tokens} tokens)",
            "/v1/generate",
            _json({"prompt": "KING:", "max_new_tokens": tokens, "temperature": 0, "stream": True}),
            tokens=tokens,
            check=_streamed(tokens),
        ),
    ]


# --- the servers ------------------------------------------------------------------------------------


@contextmanager
def baseline_checkout(ref: str) -> Iterator[Path]:
    """The service of commit ``ref``, exported to a temporary folder (``git archive``)."""
    folder = Path(tempfile.mkdtemp(prefix="request-path-baseline-"))
    try:
        archive = subprocess.run(
            ["git", "archive", ref, "service"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fake_server(
    models: Path, service_root: Path | None, frontends: int = 0, cores: str = "0"
) -> ServiceProcess:
    """``fake_serve.py`` pinned to ``cores``: this checkout's service, or the one under ``service_root``;
    ``frontends`` >= 1: the split service, its engine process on the fake engine too."""
    env = {
        "MODEL_REPOSITORY": str(models),
        "SERVED_MODELS": SERVED,
        "WORKERS": "1",
        "CACHE_ENABLED": "false",
        "ACCESS_LOG": "false",
        "LOG_LEVEL": "warning",
        "INTRA_OP_THREADS": "1",
        "GRPC_PORT": str(free_port()),
        "MAX_NEW_TOKENS": "4096",
        "FAKE_SERVICE_MS": "0",
        "FRONTENDS": str(frontends),
    }
    if service_root is not None:
        env["PYTHONPATH"] = str(service_root)
    command = ["taskset", "-c", cores, sys.executable, str(BENCH_DIR / "fake_serve.py")]
    return ServiceProcess(env, command=command, cpu_of_tree=True)


# --- the load generators ----------------------------------------------------------------------------

_WRK_SCRIPT = """
local f = io.open(os.getenv("BODY_FILE"), "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
for name, value in string.gmatch(os.getenv("BODY_HEADERS") or "", "([^\\n:]+):([^\\n]*)") do
  wrk.headers[name] = value
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('\\nRESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
    .. '"errors": %d, "status_errors": %d}\\n', summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


@dataclass
class Load:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    client_cpu_s: float


def _run_client(command: list[str], env: dict[str, str]) -> tuple[str, float]:
    """Run a load generator to its end: its output and the CPU seconds it used (``/proc`` of its tree)."""
    proc = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    cpu = 0.0
    while proc.poll() is None:
        cpu = max(cpu, process_tree_cpu_seconds(proc.pid))
        time.sleep(0.1)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({proc.returncode}): {out[-2000:]}")
    return out, cpu


def wrk(url: str, door: Door, seconds: float, connections: int, work: Path, cores: str = "1") -> Load:
    body, script = work / f"{door.name}.body", work / "post.lua"
    body.write_bytes(door.body)
    script.write_text(_WRK_SCRIPT)
    headers = {"Content-Type": "application/json", **door.headers}
    env = {"BODY_FILE": str(body), "BODY_HEADERS": "\n".join(f"{k}:{v}" for k, v in headers.items())}
    command = [
        "taskset",
        "-c",
        cores,
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--latency",
        "-s",
        str(script),
        url + door.path,
    ]
    return wrk_load(*_run_client(command, env))


def wrk_load(out: str, cpu: float) -> Load:
    """The figures ``_WRK_SCRIPT`` prints on its ``RESULT`` line, with the load generator's CPU."""
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {out[-2000:]}")
    r = json.loads(line.removeprefix("RESULT "))
    return Load(
        r["requests"],
        r["duration_us"] / 1e6,
        r["p50_us"] / 1e3,
        r["p99_us"] / 1e3,
        r["errors"] + r["status_errors"],
        cpu,
    )


def h2load(url: str, door: Door, seconds: float, connections: int, work: Path, cores: str = "1") -> Load:
    body, log = work / f"{door.name}.body", work / f"{door.name}.log"
    body.write_bytes(door.body)
    log.unlink(missing_ok=True)
    command = [
        "taskset",
        "-c",
        cores,
        "h2load",
        "-t1",
        f"-c{connections}",
        "-m1",
        f"-D{int(seconds * 1000)}ms",
        "--warm-up-time=200ms",
        "-d",
        str(body),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"--log-file={log}",
        url + door.path,
    ]
    _, cpu = _run_client(command, {})
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    ok = [int(r[2]) for r in rows if r[1] == "200"]
    failed = len(rows) - len(ok)
    return Load(len(ok), seconds, percentile(ok, 50) / 1e3, percentile(ok, 99) / 1e3, failed, cpu)


def check_door(server: ServiceProcess, door: Door) -> None:
    """One request through the door, checked, before it is loaded."""
    if door.grpc:
        import numpy as np
        import tritonclient.grpc as tgrpc

        grpc_url = f"127.0.0.1:{server.env['GRPC_PORT']}"
        client = tgrpc.InferenceServerClient(grpc_url)
        text = tgrpc.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([TEXT.encode()], dtype=object))
        label = client.infer("bert-classifier", [text]).as_numpy("label")
        client.close()
        if label is None or label.shape != (1,):
            raise RuntimeError(f"gRPC ModelInfer answered {label!r}")
        return
    headers = {"Content-Type": "application/json", **door.headers}
    door.check(httpx.post(server.url + door.path, content=door.body, headers=headers, timeout=60))


@dataclass
class Measured:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    server_cpu_us: float  # per request
    client_cpu_share: float  # of its one core
    errors: int
    requests: int


def measure(
    server: ServiceProcess, door: Door, seconds: float, connections: int, work: Path, client_cores: str = "1"
) -> Measured:
    if door.grpc:
        url = f"http://127.0.0.1:{server.env['GRPC_PORT']}"
        drive = h2load
    else:
        url = server.url
        drive = wrk
    drive(url, door, min(1.0, seconds), connections, work, client_cores)  # warm-up: connections, the loop
    before = server.cpu_seconds()
    load = drive(url, door, seconds, connections, work, client_cores)
    cpu = server.cpu_seconds() - before
    return Measured(
        load.requests / load.seconds,
        load.p50_ms,
        load.p99_ms,
        1e6 * cpu / max(1, load.requests),
        load.client_cpu_s / load.seconds,
        load.errors,
        load.requests,
    )


# --- the profile ------------------------------------------------------------------------------------


def profile(
    server: ServiceProcess, door: Door, seconds: float, connections: int, work: Path, label: str
) -> Path:
    """py-spy on the server while ``door`` is loaded: its top functions, as text."""
    raw = work / f"{label}.raw"
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    assert server.proc is not None
    recorder = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(server.proc.pid),
            "--duration",
            f"{int(seconds) + 1}",
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            str(raw),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    measure(server, door, seconds, connections, work)
    recorder.wait(timeout=60)
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 2)[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        own[frames[-1]] += n
        for frame in set(frames):
            under[frame] += n
    PROFILES.mkdir(exist_ok=True)
    out = PROFILES / f"{label}.txt"
    lines = [
        f"# py-spy, {door.label}, {connections} connections, {seconds:g} s, {total} samples at 200 Hz ({label})",
        "",
        "## Top 30 by own samples (the function itself was running)",
        *(f"{100 * n / total:5.1f}%  {name}" for name, n in own.most_common(30)),
        "",
        "## Top 40 by samples under them (the function or what it called)",
        *(f"{100 * n / total:5.1f}%  {name}" for name, n in under.most_common(40)),
    ]
    out.write_text("\n".join(lines) + "\n")
    return out


# --- the split service ------------------------------------------------------------------------------

SPLIT_DOORS = ("rest_classify_1", "generate_stream")


def _split(
    models: Path, chosen: list[Door], seconds: float, connections: int, work: Path
) -> dict[str, dict[str, Measured]]:
    """The split service on the fake engine: FRONTENDS=1 with every process on core 0 (beside the one-process
    figures of the same run, the difference is the IPC's own cost a request), then FRONTENDS=1 and 2 on both
    cores, the load generator sharing them (a 2-core machine has no core to spare)."""
    out: dict[str, dict[str, Measured]] = {}
    with fake_server(models, None, frontends=1, cores="0") as server:
        for door in chosen:
            check_door(server, door)
            out.setdefault("FRONTENDS=1", {})[door.name] = measure(server, door, seconds, connections, work)
    for frontends in (1, 2):
        label = f"FRONTENDS={frontends}, 2 cores"
        with fake_server(models, None, frontends=frontends, cores="0,1") as server:
            for door in chosen:
                out.setdefault(label, {})[door.name] = measure(
                    server, door, seconds, connections, work, client_cores="0,1"
                )
    with fake_server(models, None, frontends=0, cores="0,1") as server:
        for door in chosen:
            out.setdefault("one process, 2 cores", {})[door.name] = measure(
                server, door, seconds, connections, work, client_cores="0,1"
            )
    return out


def _split_rows(
    split: dict[str, dict[str, Measured]], metrics: dict[str, Any]
) -> tuple[list[str], list[Check]]:
    rows = [
        "",
        "The split service (FRONTENDS), same fake engine and connections:",
        "",
        "| server | door | req/s | p50 / p99 ms | server CPU µs/req |",
        "|---|---|---|---|---|",
    ]
    figures: dict[str, Any] = {}
    for label in (
        "one process",
        "FRONTENDS=1",
        "one process, 2 cores",
        "FRONTENDS=1, 2 cores",
        "FRONTENDS=2, 2 cores",
    ):
        for door, m in split.get(label, {}).items():
            cores = "cores 0-1, load generator beside it" if "2 cores" in label else "core 0"
            rows.append(
                f"| {label.split(',')[0]} ({cores}) | {door} | {m.requests_per_s:.0f} | {m.p50_ms:.1f} / "
                f"{m.p99_ms:.1f} | {m.server_cpu_us:.0f} |"
            )
            figures.setdefault(label, {})[door] = m.__dict__
    checks: list[Check] = []
    one, f1 = split.get("one process", {}), split.get("FRONTENDS=1", {})
    if "rest_classify_1" in one and "rest_classify_1" in f1:
        ipc = f1["rest_classify_1"].server_cpu_us - one["rest_classify_1"].server_cpu_us
        figures["ipc_cpu_us_per_request"] = ipc
        checks.append(Check("The split's IPC cost, CPU per one-text classify", ipc, 50.0, False, " µs"))
    two, one2 = split.get("FRONTENDS=2, 2 cores", {}), split.get("FRONTENDS=1, 2 cores", {})
    if "rest_classify_1" in two and "rest_classify_1" in one2:
        figures["frontends_2_over_1"] = (
            two["rest_classify_1"].requests_per_s / one2["rest_classify_1"].requests_per_s
        )
        inproc = split.get("one process, 2 cores", {}).get("rest_classify_1")
        if inproc:
            figures["frontends_2_over_one_process"] = (
                two["rest_classify_1"].requests_per_s / inproc.requests_per_s
            )
    metrics["split"] = figures
    return rows, checks


# --- the run ----------------------------------------------------------------------------------------


def run(opts: Options) -> Result:
    if shutil.which("wrk") is None or shutil.which("h2load") is None:
        sys.exit("error: wrk and h2load are needed: ./scripts/setup.sh --test-tools installs them")
    seconds = opts.extra.get("seconds") or (1.0 if opts.quick else 10.0)
    connections = opts.extra.get("connections") or 32
    tokens = opts.extra.get("tokens") or 32
    ref = opts.extra.get("baseline") or ("none" if opts.quick else BASELINE)
    wanted = {d for d in (opts.extra.get("doors") or "").split(",") if d}
    chosen = [d for d in doors(tokens) if not wanted or d.name in wanted]
    results: dict[str, dict[str, Measured]] = {}
    profiles: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        servers: dict[str, ServiceProcess] = {}
        if ref != "none":
            root = stack.enter_context(baseline_checkout(ref))
            servers["baseline"] = stack.enter_context(fake_server(opts.models, root))
        servers["current"] = stack.enter_context(fake_server(opts.models, None))
        for door in chosen:
            for label, server in servers.items():
                check_door(server, door)
                results.setdefault(door.name, {})[label] = measure(server, door, seconds, connections, work)
        if opts.extra.get("split"):
            split = _split(
                opts.models, [d for d in chosen if d.name in SPLIT_DOORS], seconds, connections, work
            )
            split["one process"] = {d: results[d]["current"] for d in split["FRONTENDS=1"]}
            results["split"] = split  # type: ignore[assignment]
        if opts.extra.get("profile"):
            rest = next(d for d in doors(tokens) if d.name == "rest_classify_1")
            for label, server in servers.items():
                profiles.append(
                    profile(server, rest, max(seconds, 5.0), connections, work, f"request_path_{label}")
                )
    return _result(chosen, results, ref, seconds, connections, tokens, profiles)


def _result(
    chosen: list[Door],
    results: dict[str, dict[str, Measured]],
    ref: str,
    seconds: float,
    connections: int,
    tokens: int,
    profiles: list[Path],
) -> Result:
    has_baseline = ref != "none"
    head = "| door | req/s | p50 / p99 ms | server CPU µs/req | load generator's core |"
    if has_baseline:
        head = (
            "| door | req/s (baseline → now) | p50 / p99 ms (now) | server CPU µs/req (baseline → now) | "
            "cut | load generator's core |"
        )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    metrics: dict[str, Any] = {
        "baseline": ref,
        "seconds": seconds,
        "connections": connections,
        "tokens": tokens,
    }
    split = results.pop("split", None)
    for door in chosen:
        now = results[door.name]["current"]
        figures: dict[str, Any] = {"current": now.__dict__}
        if has_baseline:
            base = results[door.name]["baseline"]
            figures["baseline"] = base.__dict__
            rows.append(
                f"| {door.label} | {base.requests_per_s:.0f} → {now.requests_per_s:.0f} | {now.p50_ms:.1f} / "
                f"{now.p99_ms:.1f} | {base.server_cpu_us:.0f} → {now.server_cpu_us:.0f} | "
                f"{base.server_cpu_us / now.server_cpu_us:.2f}x | {100 * now.client_cpu_share:.0f}% |"
            )
        else:
            rows.append(
                f"| {door.label} | {now.requests_per_s:.0f} | {now.p50_ms:.1f} / {now.p99_ms:.1f} | "
                f"{now.server_cpu_us:.0f} | {100 * now.client_cpu_share:.0f}% |"
            )
        if door.tokens:
            figures["server_cpu_us_per_token"] = now.server_cpu_us / door.tokens
        metrics[door.name] = figures
    errors = {d.name: results[d.name]["current"].errors for d in chosen if results[d.name]["current"].errors}
    details = [
        *rows,
        "",
        f"Fake engine (0 ms a batch), response cache off, {connections} closed-loop connections, {seconds:g} s "
        "a door after a warm-up; server pinned to core 0 (one process), wrk / h2load to core 1. Server CPU "
        "from /proc over the measured window, every thread of its tree."
        + (
            f" Baseline: the service at {ref}, measured door by door beside this one." if has_baseline else ""
        ),
    ]
    if errors:
        details.append(f"**Errors (non-2xx or failed) under load: {errors}.**")
    checks: list[Check] = []
    rest = metrics.get("rest_classify_1", {}).get("current")
    if rest:
        checks.append(
            Check(
                "REST classify, server CPU per request", rest["server_cpu_us"], REST_CPU_GOAL_US, False, " µs"
            )
        )
        others = [
            (metrics[d.name]["current"]["server_cpu_us"] / rest["server_cpu_us"], d.label)
            for d in chosen
            if d.name not in ("rest_classify_1", "rest_classify_8") and not d.tokens
        ]
        worst = max(others) if others else None
        if worst is not None:
            checks.append(Check(f"Costliest other door over REST ({worst[1]})", worst[0], 1.5, False))
    stream = metrics.get("generate_stream", {})
    if "server_cpu_us_per_token" in stream:
        checks.append(
            Check(
                "Streamed token, server CPU",
                stream["server_cpu_us_per_token"],
                TOKEN_CPU_GOAL_US,
                False,
                " µs",
            )
        )
    if split:
        split_rows, split_checks = _split_rows(split, metrics)  # type: ignore[arg-type]
        details.extend(split_rows)
        checks.extend(split_checks)
    if profiles:
        details.append("Profiles: " + ", ".join(str(p.relative_to(ROOT)) for p in profiles))
    metrics["errors"] = errors
    return Result(NAME, TITLE, metrics, checks, details)


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
