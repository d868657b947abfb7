"""(i) Peers: the same fused classifier behind LitServe, Ray Serve, NVIDIA Triton and Seldon MLServer, and
behind this service.

    make bench-peers        # makes the peers' venvs (once), then runs this with all of them

    python benchmarks/peers.py --peers-python .venv-peers/bin/python \
        --triton-python .venv-triton/bin/python --mlserver-python .venv-mlserver/bin/python

One ONNX file, the text classifier's ``fused`` variant (what the service serves on CPU; its path is
in the manifest's ``variants``), behind servers on loopback ports: this service (``python -m service``
from this venv, MODEL_VARIANT=fused) and, each with the python of a venv of its own (their dependencies
never enter the service's, nor each other's: PyTriton needs numpy < 2), LitServe and Ray Serve
(``--peers-python``, extra ``peers``), Triton through PyTriton (``--triton-python``, extra
``peers-triton``) and MLServer with a custom runtime (``--mlserver-python``, extra ``peers-mlserver``),
from ``benchmarks/peer_servers/``; a peer whose venv is not given is left out, and the notes say so.
Every server does the same work per request: the model folder's ``tokenizer.json`` (tokenizers), ONNX
Runtime on the fused graph with the same thread settings (INTRA_OP_THREADS, one inter-op thread),
softmax, the top label, a JSON answer; each batches dynamically, up to the same ``max_batch_size`` (the
service's MAX_BATCH_SIZE, 32), with the wait its own design needs (LitServe's ``batch_timeout``, Ray
Serve's ``batch_wait_timeout_s``, Triton's ``max_queue_delay_microseconds``, MLServer's
``max_batch_time``; the service forms batches while the model computes and never waits). Once
started, every server first answers the same texts one by one, and its labels and scores are compared
with the service's.

The same closed-loop client (``load.py``: one SST-2 sentence per request; ``POST /v1/classify``, or
KServe v2 ``infer`` to Triton and MLServer, whose HTTP protocol it is) then drives each server at 1, 8
and 32 clients. One server runs at a time: an idle peer is not idle (LitServe's worker polls its
queue, Ray's raylet and GCS keep time), and on a small machine what it burns would be taken from the
server measured. So each round starts each server in turn, measures its points and stops it, for
``--rounds`` rounds with the order reversed every other round, so that a drifting machine drifts for
all of them alike. The table gives each peer's requests/s, p50 and p99 as ratios to the service's,
and the CPU of each server's whole process tree (LitServe's API server and inference worker, Ray's
raylet, GCS, proxy and replica, Triton's server and Python backend stub). A peer that does not
install or start is reported as such, and the others are measured all the same.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/peers.py` anywhere

from benchmarks.batching import classify_request
from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.options import BENCH_DIR, ROOT, Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result, cores_used, display_path
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.ports import free_port_outside_ephemeral
from harness.processes import ThreadCPU, thread_cpu
from harness.service_process import ServiceNotReady, ServiceProcess
from harness.stats import ratio
from service.engine.instances import threads_each

NAME = "peers"
TITLE = "(i) Peers: the fused bert-classifier behind LitServe, Ray Serve, Triton and MLServer vs this service"
CONCURRENCY = (1, 8, 32)
VARIANT = "fused"
SERVICE = "service"
MAX_BATCH_SIZE = 32  # the service's default MAX_BATCH_SIZE, for all three


V2_MODEL_READY = "/v2/models/{model}/ready"


@dataclass(frozen=True)
class Peer:
    key: str  # in the JSON figures
    label: str
    script: str  # in benchmarks/peer_servers/
    batch_timeout_ms: float  # the default; see benchmarks/README.md, "Peers", for how it was chosen
    venv: str = "peers"  # which venv's python runs it: --peers-python, or --<venv>-python
    protocol: str = "classify"  # what a request is: the service's POST /v1/classify, or "v2" (KServe v2)
    ready_path: str = "/health/ready"  # {model}: the model folder's name
    env: tuple[tuple[str, str], ...] = ()  # more of the peer's environment (its instances)


PEERS = {
    "litserve": Peer("litserve", "LitServe", "litserve_server.py", 2.0),
    "ray-serve": Peer("ray_serve", "Ray Serve", "ray_serve_server.py", 0.0),
    # Triton and MLServer speak KServe v2 over HTTP; ready once the model is (the server is before it).
    "triton": Peer("triton", "Triton", "triton_server.py", 0.0, "triton", "v2", V2_MODEL_READY),
    "mlserver": Peer("mlserver", "MLServer", "mlserver_server.py", 1.0, "mlserver", "v2", V2_MODEL_READY),
}
VENVS = {  # venv -> its extra in pyproject.toml: each peer's dependencies stay out of the others'
    "peers": ".venv-peers",
    "triton": ".venv-triton",
    "mlserver": ".venv-mlserver",
}
VENV_HINT = 'python -m venv .venv-peers && .venv-peers/bin/pip install -e ".[peers]"'


def venv_hint(venv: str) -> str:
    extra = "peers" if venv == "peers" else f"peers-{venv}"
    return f'python -m venv {VENVS[venv]} && {VENVS[venv]}/bin/pip install -e ".[{extra}]"'


def classify_v2_request(texts: list[str], model: str) -> RequestFn:
    """The same texts as the service's requests, as KServe v2 infer requests (Triton's HTTP protocol): one
    BYTES input of shape [1, 1]. ``Accept-Encoding: identity``: Triton gzips its answers otherwise."""
    path = f"/v2/models/{model}/infer"

    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        response = await conn.request("POST", path, v2_body(texts[i % len(texts)]), IDENTITY)
        return response.status, {}

    return request


def v2_body(text: str) -> dict[str, object]:
    """One text as a KServe v2 infer request: a BYTES input of shape [1, 1]."""
    return {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}


IDENTITY = {"Accept-Encoding": "identity"}
# A peer's requests/s over the service's, at most: the service keeps its lead (never asserted).
TARGET = 1.0
READY_TIMEOUT_S = 300.0  # a cold Ray cluster takes tens of seconds on 2 cores
AGREEMENT_TEXTS = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peers-python",
        type=Path,
        default=None,
        help=f"python of the venv with the peer servers (make it: {VENV_HINT}); without it: skipped",
    )
    for venv in VENVS:
        if venv != "peers":
            parser.add_argument(
                f"--{venv}-python",
                type=Path,
                default=None,
                help=f"python of the venv with {venv} (make it: {venv_hint(venv)}); without it: left out",
            )
    parser.add_argument(
        "--peers", nargs="+", choices=sorted(PEERS), default=None, help="peers to run (default: all)"
    )
    parser.add_argument(
        "--as-shipped",
        action="store_true",
        help=f"the service serves the variant it chooses by default (int8 where it pays), not {VARIANT}; "
        f"the peers keep the {VARIANT} file",
    )
    parser.add_argument(
        "--profile-threads",
        type=int,
        default=None,
        metavar="CLIENTS",
        help="at this many clients, in the first round, read every server thread's CPU time before and "
        "after the point, and list where each server's CPU went, thread by thread",
    )
    parser.add_argument(
        "--instances",
        type=int,
        nargs="+",
        default=None,
        help="also run the service with MODEL_INSTANCES=N, and Triton with N instances (TRITON_INSTANCES), "
        "the intra-op threads split between them as the service splits them, for each N > 1 given",
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per point (default 4, quick 0.5)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=None, help=f"clients per point (default {CONCURRENCY})"
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=MAX_BATCH_SIZE,
        help=f"largest batch, all three servers (default {MAX_BATCH_SIZE})",
    )
    for name, peer in PEERS.items():
        parser.add_argument(
            f"--{name}-batch-timeout-ms",
            type=float,
            default=None,
            help=f"{peer.label}'s wait for a batch to fill (default {peer.batch_timeout_ms:g})",
        )


def skip_reason(opts: Options) -> str | None:
    """Why this benchmark cannot run with these options (run_all skips it then), or None: it runs when at
    least one peer's venv is given (the peers of a venv not given are left out, and the result says so)."""
    pythons = {venv: opts.extra.get(f"{venv}_python") for venv in VENVS}
    if not any(pythons.values()):
        return f"no --peers-python given: make the peers' venv with `{VENV_HINT}`, then pass its python"
    for venv, python in pythons.items():
        if python is not None and not Path(python).is_file():
            return f"--{venv}-python {python} does not exist (make it with `{venv_hint(venv)}`)"
    return None


def fused_graph(folder: Path) -> str:
    variant = json.loads((folder / "manifest.json").read_text()).get("variants", {}).get(VARIANT)
    if variant is None:
        sys.exit(
            f"error: {folder} has no {VARIANT} variant: "
            f"`python -m model_export variants --models {folder.parent} --only {folder.name}` writes it"
        )
    return str(variant["graphs"]["model"])


async def _answers(
    server: ServiceProcess, texts: list[str], protocol: str, model: str
) -> list[tuple[str, float]]:
    conn = HTTPConnection("127.0.0.1", server.port)
    try:
        found = []
        for text in texts:
            if protocol == "v2":
                response = await conn.request("POST", f"/v2/models/{model}/infer", v2_body(text), IDENTITY)
                assert response.status == 200, f"{server.command}: {response.status} {response.body[:300]!r}"
                outputs = {o["name"]: o["data"][0] for o in response.json()["outputs"]}
                found.append((str(outputs["label"]), float(outputs["score"])))
                continue
            response = await conn.request("POST", "/v1/classify", {"text": text}, BYPASS_CACHE)
            assert response.status == 200, f"{server.command}: {response.status} {response.body[:300]!r}"
            result = response.json()["results"][0]
            found.append((str(result["label"]), float(result["score"])))
        return found
    finally:
        await conn.close()


def _version_line(server: ServiceProcess, label: str) -> str:
    """The line a peer script logs first (its framework's version and settings)."""
    return next((line for line in server.log().splitlines() if line.startswith(label + " ")), label)


def run(opts: Options) -> Result:
    reason = skip_reason(opts)
    if reason is not None:
        sys.exit(f"error: {reason}")
    pythons = {venv: Path(p) for venv in VENVS if (p := opts.extra.get(f"{venv}_python")) is not None}
    folder = find_model(opts.models, "text-classification")
    graph = fused_graph(folder)
    asked = opts.extra.get("peers") or list(PEERS)
    chosen = {PEERS[name].key: PEERS[name] for name in asked if PEERS[name].venv in pythons}
    left_out = {PEERS[n].label: venv_hint(PEERS[n].venv) for n in asked if PEERS[n].venv not in pythons}
    concurrency = opts.extra.get("concurrency") or ([1, 32] if opts.quick else list(CONCURRENCY))
    duration = opts.extra.get("duration") or (0.5 if opts.quick else 4.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    warmup = 0.2 if opts.quick else 1.0
    max_batch = opts.extra.get("max_batch_size") or MAX_BATCH_SIZE
    timeouts: dict[str, float] = {}
    for name, peer in PEERS.items():
        given = opts.extra.get(f"{name.replace('-', '_')}_batch_timeout_ms")
        if peer.key in chosen:
            timeouts[peer.key] = peer.batch_timeout_ms if given is None else given
    texts = sentiment_texts()
    sample = texts[:AGREEMENT_TEXTS]
    # MODEL_INSTANCES=N: the service, and Triton's instance_group, with N sessions of the model
    service_runs: dict[str, dict[str, str]] = {SERVICE: {}}
    for n in sorted({n for n in opts.extra.get("instances") or [] if n > 1}):
        service_runs[f"{SERVICE}_i{n}"] = {"MODEL_INSTANCES": str(n)}
        if "triton" in chosen:  # as the service's instances: the intra-op threads split between them
            extra = (("TRITON_INSTANCES", str(n)), ("INTRA_OP_THREADS", str(threads_each(opts.threads, n))))
            chosen[f"triton_i{n}"] = replace(
                chosen["triton"], key=f"triton_i{n}", label=f"Triton, {n} instances", env=extra
            )
            timeouts[f"triton_i{n}"] = timeouts["triton"]
    labels = {
        SERVICE: "this service",
        **{
            key: f"this service, {key.rsplit('_i', 1)[1]} instances" for key in service_runs if key != SERVICE
        },
        **{key: p.label for key, p in chosen.items()},
    }
    requests = {
        key: classify_v2_request(texts, folder.name)
        if key in chosen and chosen[key].protocol == "v2"
        else classify_request(texts)
        for key in [*service_runs, *chosen]
    }
    service_env = {"MODEL_VARIANT": VARIANT, "MAX_BATCH_SIZE": str(max_batch)}
    as_shipped = bool(opts.extra.get("as_shipped"))
    served_variant = VARIANT

    def server_for(key: str, repo: Path) -> ServiceProcess:
        if key in service_runs:
            env: dict[str, str | None] = {
                **service_env,
                "MODEL_VARIANT": None if as_shipped else VARIANT,
                **service_runs[key],
            }
            return benchmark_server(repo, opts, env=env, cpu_of_tree=True)
        peer = chosen[key]
        env = {
            "MODEL_DIR": str(folder),
            "BATCH_TIMEOUT_MS": f"{timeouts[key]:g}",
            # the gRPC and metrics ports a peer binds too (Triton, MLServer), unused here
            "PEER_GRPC_PORT": str(free_port_outside_ephemeral()),
            "PEER_METRICS_PORT": str(free_port_outside_ephemeral()),
            **service_env,
            **dict(peer.env),
        }
        command = [str(pythons[peer.venv]), str(BENCH_DIR / "peer_servers" / peer.script)]
        # Ray binds a dozen ports the OS picks after start-up: ours must not be one the OS could pick.
        port = free_port_outside_ephemeral()
        return benchmark_server(
            repo,
            opts,
            env=env,
            command=command,
            cpu_of_tree=True,
            port=port,
            ready_path=peer.ready_path.format(model=folder.name),
        )

    runs: dict[str, dict[int, list[LoadPoint]]] = {key: {c: [] for c in concurrency} for key in labels}
    profile_at: int | None = opts.extra.get("profile_threads")
    profiles: dict[str, list[tuple[str, float]]] = {}  # server -> (thread, CPU seconds) over the point
    ready: dict[str, list[float]] = {key: [] for key in labels}
    context: dict[str, str] = {}
    answers: dict[str, list[tuple[str, float]]] = {}
    not_started: dict[str, str] = {}
    provider = "unknown"
    with subset_repository([folder]) as repo:
        for r in range(rounds):
            for key in list(labels) if r % 2 == 0 else list(labels)[::-1]:
                if key in not_started:
                    continue
                server = server_for(key, repo)
                try:
                    try:
                        server.start(READY_TIMEOUT_S)
                    except ServiceNotReady as exc:
                        if key == SERVICE:
                            raise
                        not_started[key] = str(exc)
                        print(f"{labels[key]} did not start: {exc}", file=sys.stderr)
                        continue
                    ready[key].append(server.ready_s)
                    if key == SERVICE and key not in answers:
                        served = server.get_json("/v1/models")["data"][0]
                        served_variant = str(served["variant"])
                        assert as_shipped or served_variant == VARIANT, f"the service serves {served_variant}"
                        provider = providers(server)
                    context.setdefault(key, _version_line(server, labels[key]))
                    protocol = chosen[key].protocol if key in chosen else "classify"
                    answers.setdefault(key, run_async(_answers(server, sample, protocol, folder.name)))
                    for c in concurrency:
                        point = closed_loop(server, c, requests[key], duration_s=duration, warmup_s=warmup)
                        if r == 0 and c == profile_at and server.proc is not None:
                            measured, by_thread = profile_threads(server.proc.pid, partial(run_async, point))
                            runs[key][c].append(measured)
                            profiles[key] = by_thread
                        else:
                            runs[key][c].append(run_async(point))
                finally:
                    server.close()
    points = {
        key: {c: merge_points(ps) for c, ps in by_c.items()} for key, by_c in runs.items() if key in answers
    }
    # requests/s: the median of the rounds (each round's own figure); latencies pooled over the rounds
    median_rps = {
        key: {c: statistics.median(p.rps for p in ps) for c, ps in by_c.items()}
        for key, by_c in runs.items()
        if key in answers
    }

    metrics: dict[str, object] = {
        "model": folder.name,
        "graph": graph,
        "duration_s": duration,
        "service_variant": served_variant,
    }
    rows = [
        "| clients | server | requests/s | vs service | p50 ms | vs service | p99 ms | vs service | errors | "
        "server CPU ms / request | server cores | client cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in concurrency:
        for key, by_c in points.items():
            rps = (median_rps[key][c], median_rps[SERVICE][c])
            rows.append(_row(c, key, labels[key], by_c[c], points[SERVICE][c], rps, metrics))
    top = max(concurrency)
    checks = []
    for key in points:
        if key != SERVICE:
            value = float(metrics[f"{key}_over_service_rps_c{top}"])  # type: ignore[arg-type]
            metrics[f"{key}_over_service_{top}"] = value
            checks.append(
                Check(f"{labels[key]} / this service, requests/s at {top} clients", value, TARGET, False)
            )
    for key, error in not_started.items():
        metrics[f"{key}_error"] = error.splitlines()[0]

    details = [*rows, ""]
    for key, found in answers.items():
        what = "`python -m service`" if key == SERVICE else context[key]
        starts = ", ".join(f"{t:.1f}" for t in ready[key])
        agreement = "the reference" if key == SERVICE else _agreement(answers[SERVICE], found)
        details.append(
            f"- {labels[key]}: {what}; ready {starts} s after spawn; {len(sample)} texts sent one by one: "
            f"{agreement}"
        )
    details += [
        f"- {labels[key]} **did not start**: {_first_lines(error)}" for key, error in not_started.items()
    ]
    if profiles and profile_at is not None:
        details += ["", f"Thread by thread at {profile_at} clients (round 1), CPU ms per request:", ""]
        for key, by_thread in profiles.items():
            # The readings span the warm-up too: each thread's share of them, times the point's own CPU.
            measured = runs[key][profile_at][0]
            total = sum(seconds for _, seconds in by_thread) or 1.0
            cpu = measured.server_cpu_s if not math.isnan(measured.server_cpu_s) else total
            per_request = cpu / max(measured.requests, 1)
            cells = ", ".join(
                f"{name} {1e3 * per_request * seconds / total:.1f} ({100 * seconds / total:.0f}%)"
                for name, seconds in by_thread[:8]
            )
            details.append(f"- {labels[key]}: {cells}")
    details += [
        f"- {label}: left out, its venv not given (make it: `{hint}`)" for label, hint in left_out.items()
    ]
    batching = ", ".join(f"{labels[k]} {t:g} ms" for k, t in timeouts.items())
    used = {chosen[k].venv for k in chosen}
    venvs = ", ".join(f"`{display_path(p)}`" for venv, p in pythons.items() if venv in used)
    details += [
        "",
        f"Model `{folder.name}`, its `{VARIANT}` graph `{graph}` in every server (the service with "
        + (
            f"the variant it chooses by default, as shipped: `{served_variant}`)"
            if as_shipped
            else f"MODEL_VARIANT={VARIANT})"
        )
        + f", intra-op threads {opts.threads or 'one per core'} and 1 inter-op thread; "
        f"max batch {max_batch} everywhere; batch wait: this service none (batches form while the model "
        f"computes), {batching}. Peers run under {venvs}. One SST-2 validation sentence "
        f"per request ({len(texts)} in rotation); {rounds} round(s) of {duration:g} s per point after "
        f"{warmup:g} s of warm-up; one server at a time, each round starting and stopping each in turn (the "
        "order reversed every other round). requests/s: the median of the rounds; p50 and p99 over every round's requests; "
        "'CPU ms / request' and 'cores': CPU time of the server's whole process tree, per request and over wall time.",
    ]
    v2 = [chosen[k].label for k in chosen if chosen[k].protocol == "v2"]
    if v2:
        details.append(
            'Requests: `POST /v1/classify` with `{"text": ...}`, but to '
            + " and ".join(v2)
            + f" KServe v2, their HTTP protocol (`POST /v2/models/{folder.name}/infer`, one BYTES input of "
            "shape [1, 1], `Accept-Encoding: identity`): the same texts, a JSON answer each."
        )
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


def profile_threads(pid: int, measure: Callable[[], LoadPoint]) -> tuple[LoadPoint, list[tuple[str, float]]]:
    """``measure()`` with the CPU time of every thread of the server's process tree read before and after;
    the threads named as their Python names them (``py-spy dump``, where it is installed: the peers'
    venv has it) or by their own name, ``native`` for the threads no Python code runs on (ONNX Runtime's
    pool, a C++ server's). Returns the point and (thread, CPU seconds) by CPU, highest first."""
    before = thread_cpu(pid)
    point = measure()
    after = thread_cpu(pid)
    names = _python_thread_names(after)
    spent: dict[str, float] = {}
    for tid, thread in after.items():
        seconds = thread.seconds - (before[tid].seconds if tid in before else 0.0)
        if seconds > 0:
            name = f"{thread.process}: {names.get(tid) or _native_name(thread)}"
            spent[name] = spent.get(name, 0.0) + seconds
    return point, sorted(spent.items(), key=lambda item: -item[1])


def _native_name(thread: ThreadCPU) -> str:
    """A thread no Python code names: its own name, or ``native`` when it only has its process's."""
    return f"native {thread.thread}" if thread.thread == thread.process else thread.thread


def _python_thread_names(threads: dict[int, ThreadCPU]) -> dict[int, str]:
    """Thread id -> Python thread name, for the Python processes among ``threads`` (py-spy's dump)."""
    spy = shutil.which("py-spy") or str(ROOT / ".venv-peers" / "bin" / "py-spy")
    names: dict[int, str] = {}
    for pid in {t.pid for t in threads.values()}:
        try:
            dumped = subprocess.run(
                [spy, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=30
            )
            for thread in json.loads(dumped.stdout or "[]"):
                if thread.get("os_thread_id"):
                    names[int(thread["os_thread_id"])] = str(thread.get("thread_name") or "python thread")
        except (OSError, ValueError, subprocess.TimeoutExpired):
            continue  # not a Python process, or no py-spy
    return names


def _row(
    clients: int,
    key: str,
    label: str,
    p: LoadPoint,
    service: LoadPoint,
    rps: tuple[float, float],
    metrics: dict[str, object],
) -> str:
    """One server's line of the table; its figures (and a peer's ratios to the service's) into ``metrics``.
    ``rps``: the server's and the service's median requests/s over the rounds."""
    cells = []
    for what, value, reference in [
        ("rps", rps[0], rps[1]),
        ("p50_ms", p.p(50) * 1e3, service.p(50) * 1e3),
        ("p99_ms", p.p(99) * 1e3, service.p(99) * 1e3),
    ]:
        metrics[f"{key}_{what}_c{clients}"] = value
        if key != SERVICE:
            metrics[f"{key}_over_service_{what.removesuffix('_ms')}_c{clients}"] = ratio(value, reference)
        cells += [f"{value:.1f}", "1" if key == SERVICE else f"{ratio(value, reference):.2f}"]
    metrics[f"{key}_errors_c{clients}"] = p.errors
    cpu_ms = p.server_cpu_s / p.requests * 1e3 if p.requests else float("nan")
    metrics[f"{key}_cpu_ms_per_request_c{clients}"] = cpu_ms
    cores = [cores_used(p.server_cpu_s, p.seconds), cores_used(p.client_cpu_s, p.seconds)]
    return f"| {clients} | {label} | {' | '.join(cells)} | {p.errors} | {cpu_ms:.1f} | {' | '.join(cores)} |"


def _agreement(reference: list[tuple[str, float]], found: list[tuple[str, float]]) -> str:
    same = sum(a[0] == b[0] for a, b in zip(reference, found, strict=True))
    diff = max(abs(a[1] - b[1]) for a, b in zip(reference, found, strict=True))
    return f"{same}/{len(reference)} labels as the service's, scores within {diff:.1e}"


def _first_lines(text: str, n: int = 2) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " / ".join(lines[:n] + (["...", lines[-1]] if len(lines) > n else []))


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
