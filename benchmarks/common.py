"""What every benchmark shares: options, the model repository, a real server subprocess, load clients,
machine information and the RESULTS.md table.

A benchmark module defines ``NAME``, ``TITLE``, ``add_arguments(parser)`` (its own options) and
``run(opts) -> Result``; ``main(module)`` turns that into a script that prints the figures, appends a
dated table to RESULTS.md and optionally writes JSON. ``run_all.py`` calls the same ``run`` functions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gzip
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
DEFAULT_MODELS = ROOT / "models"
DEFAULT_RESULTS = BENCH_DIR / "RESULTS.md"
PYTHON = sys.executable

# ONNX Runtime threads per operator, for the served model and for in-process runs alike: 0 is ONNX
# Runtime's (and the service's) default, one per core. The load generator shares the cores but costs
# at most ~0.1 core (the tables report it), so the server gets them all, as it would in production;
# its event loop then competes with ONNX Runtime's threads, which is part of what the overhead
# benchmark measures. With 1 thread on 2 cores the event loop gets a core to itself but half the
# compute sits idle (measured: served/raw 0.89 instead of 0.83, at 0.57x the throughput).
DEFAULT_THREADS = 0

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


# --- options and results ---------------------------------------------------------------------------


@dataclass
class Options:
    models: Path = DEFAULT_MODELS
    quick: bool = False
    threads: int = DEFAULT_THREADS
    device: str = "auto"
    results: Path | None = DEFAULT_RESULTS  # None: do not record
    out_dir: Path = BENCH_DIR  # where plots go
    extra: dict[str, Any] = field(default_factory=dict)  # a benchmark's own options


@dataclass(frozen=True)
class Check:
    """One headline ratio against its target (never asserted: a MISS is reported, not raised)."""

    label: str
    value: float
    target: float
    higher_is_better: bool = True
    unit: str = "x"

    @property
    def passed(self) -> bool:
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def row(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        return (
            f"| {self.label} | {self.value:.2f}{self.unit} | {op} {self.target:g}{self.unit} | "
            f"{'PASS' if self.passed else 'MISS'} |"
        )

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "PASS" if self.passed else "MISS"
        return f"{self.label}: {self.value:.2f}{self.unit} (target {op} {self.target:g}{self.unit}) {verdict}"


@dataclass
class Result:
    name: str
    title: str
    metrics: dict[str, Any]  # the JSON figures (run_all's keys among them)
    checks: list[Check]
    details: list[str]  # markdown: tables and notes
    context: dict[str, str] = field(default_factory=dict)  # e.g. the execution provider
    seconds: float = 0.0


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--models", type=Path, default=DEFAULT_MODELS, help="model repository (default: models/)"
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke-test sizes, not figures")
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"ONNX Runtime intra-op threads, server and in-process (default {DEFAULT_THREADS}: one per core)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument(
        "--results", type=Path, default=DEFAULT_RESULTS, help="the markdown file the table is appended to"
    )
    parser.add_argument("--no-record", action="store_true", help="do not append to the results file")
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR, help="where plots are written")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    common = {"models", "quick", "threads", "device", "json", "results", "no_record", "out_dir"}
    return Options(
        models=args.models,
        quick=args.quick,
        threads=args.threads,
        device=args.device,
        results=None if args.no_record else args.results,
        out_dir=args.out_dir,
        extra={k: v for k, v in vars(args).items() if k not in common},
    )


def main(module: ModuleType) -> int:
    """Script entry point of a benchmark module: parse, check the repository, run, print, record."""
    parser = base_parser(module.TITLE)
    module.add_arguments(parser)
    args = parser.parse_args()
    opts = options_from(args)
    fail_without_repository(opts.models)
    result = timed_run(module, opts)
    print_result(result)
    if opts.results is not None:
        append_results(opts.results, [result], opts, title=result.title)
        print(f"appended to {opts.results}")
    if args.json is not None:
        write_json(
            args.json, {**result.metrics, "machine": machine_info(), "options": describe_options(opts)}
        )
    return 0


def timed_run(module: ModuleType, opts: Options) -> Result:
    started = time.perf_counter()
    result: Result = module.run(opts)
    result.seconds = time.perf_counter() - started
    return result


def print_result(result: Result) -> None:
    print(f"\n== {result.title} ({result.seconds:.0f}s)")
    print("\n".join(result.details))
    for check in result.checks:
        print(check.line())


def _finite(value: Any) -> Any:
    """NaN and infinities become null: strict JSON has no such numbers."""
    if (isinstance(value, float) and value != value) or value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")


def describe_options(opts: Options) -> dict[str, Any]:
    return {
        "models": str(opts.models),
        "quick": opts.quick,
        "intra_op_threads": opts.threads,
        "device": opts.device,
    }


# --- the model repository ----------------------------------------------------------------------------


def fail_without_repository(models: Path) -> None:
    """Exit with a clear message when ``models`` is not a model repository."""
    if not models.is_dir():
        sys.exit(
            f"error: model repository {models} does not exist. Build it first "
            "(`make serve`, or `python -m model_export all --profile default --out models`; "
            "`--profile tiny` for a fast look) or pass --models DIR."
        )
    if not any((p / "manifest.json").is_file() for p in models.iterdir() if p.is_dir()):
        sys.exit(f"error: {models} holds no model folder (no */manifest.json): is the build still running?")


def find_model(models: Path, task: str) -> Path:
    """The folder serving ``task`` (the first in name order, as the service picks its default)."""
    for folder in sorted(p for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")):
        manifest = folder / "manifest.json"
        if folder.name.endswith(".partial") or not manifest.is_file():
            continue
        with contextlib.suppress(ValueError, OSError):
            if json.loads(manifest.read_text()).get("task") == task:
                return folder
    sys.exit(f"error: {models} has no {task} model (no folder whose manifest.json says task {task!r})")


def model_folders(models: Path) -> list[Path]:
    return sorted(
        p
        for p in models.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and not p.name.endswith(".partial")
        and (p / "manifest.json").is_file()
    )


@contextlib.contextmanager
def subset_repository(folders: Sequence[Path]) -> Iterator[Path]:
    """A temporary repository holding only ``folders`` (symlinks), so a server loads what it needs."""
    root = Path(tempfile.mkdtemp(prefix="bench-repo-"))
    try:
        for folder in folders:
            (root / folder.name).symlink_to(folder.resolve(), target_is_directory=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def data_dir() -> Path | None:
    candidates = [os.environ.get("DATA_DIR"), ROOT.parent / "shared" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


_FALLBACK_TEXTS = [
    "a gorgeous, witty, seductive movie.",
    "the plot is nothing but boilerplate clichés from start to finish.",
    "it's a charming and often affecting journey.",
    "unflinchingly bleak and desperate",
    "a dull, simple-minded and stereotypical tale of drugs, death and mind-numbing indifference.",
    "the acting, costumes, music, cinematography and sound are all astounding given the budget.",
    "it's slow -- very, very slow.",
    "a sometimes tedious film.",
]


def sentiment_texts() -> list[str]:
    """SST-2 validation sentences (real lengths), or a small built-in list without the data folder."""
    root = data_dir()
    path = root / "sst2" / "validation.tsv" if root else None
    if path is None or not path.is_file():
        return list(_FALLBACK_TEXTS)
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.rsplit("\t", 1)[0].strip() for line in lines if line.strip()]


def english_sentences() -> list[str]:
    root = data_dir()
    path = root / "multi30k" / "validation.en.gz" if root else None
    if path is None or not path.is_file():
        return ["A man is riding a bicycle.", "Two dogs play in the snow.", "A woman reads a book."]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def shakespeare_prompts(n: int, chars: int = 48) -> list[str]:
    """``n`` prompts cut from Tiny Shakespeare's validation text at line starts."""
    root = data_dir()
    path = root / "tinyshakespeare" / "validation.txt" if root else None
    text = path.read_text(encoding="utf-8") if path is not None and path.is_file() else ""
    starts = [i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1 : i + 2].isalpha()]
    prompts = [text[s : s + chars].rsplit(" ", 1)[0] or text[s : s + chars] for s in starts]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        prompts = ["ROMEO:\n", "KING:\nWhat say you", "First Citizen:\nBefore we proceed"]
    step = max(1, len(prompts) // n)
    return [prompts[(i * step) % len(prompts)] for i in range(n)]


# --- numbers --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


# --- machine information and RESULTS.md ------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine_info() -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    meminfo = _read("/proc/meminfo")
    mem_kb = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")), 0)
    try:
        import onnxruntime as ort

        ort_version, available = ort.__version__, ort.get_available_providers()
    except ImportError:  # pragma: no cover - the service needs it
        ort_version, available = "missing", []
    return {
        "cpu": models[0] if models else platform.processor() or "unknown",
        "cores": len(models) or os.cpu_count() or 0,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "onnxruntime": ort_version,
        "available_providers": available,
        "python": platform.python_version(),
        "git": git_revision(),
    }


def git_revision() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}{' (uncommitted changes in the tree)' if dirty else ''}"


def append_results(path: Path, results: Sequence[Result], opts: Options, title: str) -> None:
    """Append one dated section: the run's context, the headline ratios, then each benchmark's details."""
    info = machine_info()
    providers = sorted({r.context["provider"] for r in results if r.context.get("provider")})
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    threads = opts.threads or f"0 (one per core: {info['cores']})"
    lines = [
        f"## {now}: {title}{' (--quick: smoke-test sizes, not figures)' if opts.quick else ''}",
        "",
        "| date | machine | ONNX Runtime | provider | git | models | intra-op threads |",
        "|---|---|---|---|---|---|---|",
        f"| {now} | {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM | {info['onnxruntime']} | "
        f"{', '.join(providers) or 'n/a'} | {info['git']} | `{display_path(opts.models)}` | "
        f"{threads} |",
        "",
        f"Client and server share the {info['cores']} cores: the load generator (asyncio + uvloop, a minimal "
        "HTTP/1.1 client) costs at most ~0.1 core, and the tables give the CPU each process used ('cores': CPU "
        "time over wall time). The server runs with INTRA_OP_THREADS as above; its event loop (HTTP, JSON, "
        "tokenisation) competes with ONNX Runtime's threads for the same cores.",
        "",
    ]
    checks = [c for r in results for c in r.checks]
    if checks:
        lines += [
            "| figure | measured | target | verdict |",
            "|---|---|---|---|",
            *(c.row() for c in checks),
            "",
        ]
    for r in results:
        if len(results) > 1:
            lines += [f"### {r.title} ({r.seconds:.0f} s)", ""]
        lines += [*r.details, ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write(
                "# Benchmark results\n\nAppended by `python benchmarks/run_all.py` (or one benchmark script); "
                "newest last. Each figure is a ratio measured side by side in one run.\n\n"
            )
        f.write("\n".join(lines) + "\n")


# --- the real server as a subprocess -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
    if len(fields) < 13:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """``python -m service`` (or another command) on a free loopback port, configured by environment variables."""

    def __init__(
        self,
        repository: Path,
        opts: Options,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        log_level: str = "warning",
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = list(command or [PYTHON, "-m", "service"])
        self.env = {
            **os.environ,
            "MODEL_REPOSITORY": str(repository),
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "WORKERS": "1",
            "LOG_LEVEL": log_level,
            "DEVICE": opts.device,
            "INTRA_OP_THREADS": str(opts.threads),
            "INTER_OP_THREADS": "1",
            "ORT_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        # The server writes its log here for as long as it runs; close() removes it.
        self.log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0
        self.ready_s = float("nan")  # spawn -> /health/ready 200

    def start(self, timeout_s: float = 180.0) -> Server:
        self.spawned_at = time.perf_counter()
        self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=self.log, stderr=self.log)
        deadline = self.spawned_at + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.get_status("/health/ready") == 200:
                self.ready_s = time.perf_counter() - self.spawned_at
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the server was not ready within {timeout_s:.0f}s:\n{self.log_tail()}")

    def get_status(self, path: str) -> int | None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        except OSError:
            return None
        finally:
            conn.close()

    def get_json(self, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def providers(self) -> str:
        """The execution providers the loaded models really run on (from /v1/models)."""
        try:
            models = self.get_json("/v1/models")["models"]
        except (OSError, ValueError, KeyError):
            return "unknown"
        return ", ".join(sorted({m.get("execution_provider", "?") for m in models}))

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid) if self.proc is not None else float("nan")

    def log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- load clients -----------------------------------------------------------------------------------------

# Throughput benchmarks must never be answered by the response cache: no lookup (no-cache), and
# nothing stored either (no-store), so the cache costs them nothing and does not grow.
BYPASS_CACHE = {"Cache-Control": "no-cache, no-store"}
MISS = {"Cache-Control": "no-cache"}  # a cache miss on purpose: computed fresh (and stored)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class HTTPConnection:
    """A minimal HTTP/1.1 keep-alive client connection on asyncio streams: one request at a time.

    Why not httpx: client and server share the machine's cores, and on this 2-core box httpx costs
    about 0.66 ms of CPU per request against 0.05 ms for this client (measured with the tiny
    classifier); whatever the client burns is taken from the server being measured. It speaks just
    what the service answers: Content-Length or chunked bodies, streamed chunks for Server-Sent Events.
    """

    def __init__(self, host: str, port: int, timeout_s: float = 120.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _send(self, method: str, path: str, body: bytes, headers: dict[str, str] | None) -> None:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if body or method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    async def _head(self) -> tuple[int, dict[str, str]]:
        assert self._reader is not None
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return int(status_line.split(" ", 2)[1]), headers

    async def _chunks(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        reader = self._reader
        assert reader is not None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                        pass
                    break
                yield (await reader.readexactly(size + 2))[:-2]
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length:
                yield await reader.readexactly(length)
        else:  # the body runs to the end of the connection
            yield await reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            await self.close()

    async def request(
        self, method: str, path: str, payload: Any = None, headers: dict[str, str] | None = None
    ) -> Response:
        body = b"" if payload is None else json.dumps(payload).encode()
        try:
            return await asyncio.wait_for(self._exchange(method, path, body, headers), self.timeout_s)
        except BaseException:
            await self.close()  # a half-read response must not poison the next request
            raise

    async def _exchange(
        self, method: str, path: str, body: bytes, headers: dict[str, str] | None
    ) -> Response:
        await self._send(method, path, body, headers)
        status, got = await self._head()
        return Response(status, got, b"".join([chunk async for chunk in self._chunks(got)]))

    async def stream(
        self, path: str, payload: Any, headers: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[int, bytes]]:
        """POST and yield (status, body chunk) as they arrive."""
        try:
            await self._send("POST", path, json.dumps(payload).encode(), headers)
            status, got = await self._head()
            async for chunk in self._chunks(got):
                yield status, chunk
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._reader = self._writer = None


async def sse_events(chunks: AsyncIterator[tuple[int, bytes]]) -> AsyncIterator[tuple[int, str, str]]:
    """(status, event name, data) per Server-Sent Event of a streamed response.

    A response that is no event stream (an HTTP error answered as JSON) comes out as one
    (status, "", body) item.
    """
    buffer, status, events = b"", 0, 0
    async for status, chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            event, data = "message", []
            for line in block.decode().split("\n"):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
            if data or event != "message":
                events += 1
                yield status, event, "\n".join(data)
    if not events:
        yield status, "", buffer.decode(errors="replace")


@dataclass
class LoadPoint:
    """A closed-loop load: ``concurrency`` clients, each sending its next request when the last one returns."""

    concurrency: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)  # per-request figures a request fn reports
    client_cpu_s: float = 0.0
    server_cpu_s: float = float("nan")
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return ratio(self.requests, self.seconds)

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)

    def total(self, key: str) -> float:
        return float(sum(self.extra.get(key, [])))


def merge_points(points: Sequence[LoadPoint]) -> LoadPoint:
    """Several measurements of the same load as one: counts, times and samples added up."""
    merged = LoadPoint(points[0].concurrency, server_cpu_s=0.0)
    for p in points:
        merged.requests += p.requests
        merged.errors += p.errors
        merged.seconds += p.seconds
        merged.latencies += p.latencies
        merged.client_cpu_s += p.client_cpu_s
        merged.server_cpu_s += p.server_cpu_s
        for k, v in p.extra.items():
            merged.extra.setdefault(k, []).extend(v)
        for status, n in p.statuses.items():
            merged.statuses[status] = merged.statuses.get(status, 0) + n
    return merged


# A request function: (connection, request number) -> (HTTP status, per-request figures).
RequestFn = Callable[[HTTPConnection, int], Awaitable[tuple[int, dict[str, float]]]]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is, with uvicorn[standard]): the client then costs the shared cores less."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def run_async(coro: Awaitable[Any]) -> Any:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def closed_loop(
    server: Server,
    concurrency: int,
    request: RequestFn,
    *,
    duration_s: float,
    warmup_s: float = 0.5,
) -> LoadPoint:
    """Warm up for ``warmup_s``, then measure for ``duration_s``: no client starts a request after that.

    One keep-alive connection per client. Only requests started inside the window count; the window
    closes when the last of them returns.
    """
    connections = [HTTPConnection("127.0.0.1", server.port) for _ in range(concurrency)]
    counter = iter(range(10**12))
    try:
        if warmup_s > 0:
            warm_until = time.perf_counter() + warmup_s

            async def warm(conn: HTTPConnection) -> None:
                while time.perf_counter() < warm_until:
                    await request(conn, next(counter))

            await asyncio.gather(*(warm(c) for c in connections))
        point = LoadPoint(concurrency)
        cpu0, server0 = time.process_time(), server.cpu_seconds()
        started = time.perf_counter()
        until = started + duration_s

        async def worker(conn: HTTPConnection) -> None:
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                status, figures = await request(conn, next(counter))
                point.latencies.append(time.perf_counter() - t0)
                point.statuses[status] = point.statuses.get(status, 0) + 1
                if status == 200:
                    point.requests += 1
                    for k, v in figures.items():
                        point.extra.setdefault(k, []).append(v)
                else:
                    point.errors += 1

        await asyncio.gather(*(worker(c) for c in connections))
        point.seconds = time.perf_counter() - started
        point.client_cpu_s = time.process_time() - cpu0
        point.server_cpu_s = server.cpu_seconds() - server0
    finally:
        for conn in connections:
            await conn.close()
    return point


def cores_used(cpu_s: float, seconds: float) -> str:
    return f"{cpu_s / seconds:.2f}" if seconds > 0 and cpu_s == cpu_s else "n/a"


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)
