"""(n) The live model repository: loads while serving, latency during reloads, memory per model, the scan.

One real server (``python -m service``, ``MODEL_CONTROL_MODE=explicit``, ``SERVED_MODELS`` the text
classifier, the service's other defaults; control calls are open because it listens on loopback and
has no ADMIN_API_KEYS) on the whole repository given: the load route refuses a folder that is a link
out of the repository, so the temporary repository of symlinks the other benchmarks use would not do.

1. Load times: every other model loaded in turn through ``POST /v2/repository/models/{name}/load``,
   each call timed by the wall clock to its 200, beside the server's own figure for it (the growth of
   ``tserve_model_load_seconds_sum``); then reloaded while it serves (the new version built and warmed
   beside the serving one, then swapped in), unloaded, and loaded again. The classifier, serving from
   the start, is only reloaded.
2. Latency while reloading (the headline): 32 closed-loop clients on ``/v1/classify`` (one SST-2
   sentence per request, ``Cache-Control: no-cache, no-store``), in windows that take turns, steady
   then reloading (the order swapped every round) so that the machine's drift hits both alike; in a
   reloading window the classifier is reloaded over the HTTP route every ~1 s, from the window's first
   measured instant. p50 and p99 of each kind of window; every answer but a 200 counted (there must
   be none).
3. Resident memory per model, first, on a server of its own: its VmRSS (``/proc/<pid>/status``), the
   lowest over a few idle seconds, before and after each model is loaded alone, and after it is unloaded
   again. That server's trimmer hands freed heap back at 1 MiB (``MALLOC_TRIM_MIB=1``; the default 32
   would leave what an unloaded model freed to glibc, and the next model, reusing it, would seem to hold
   nothing).
4. The repository watch: one plain scan (what ``MODEL_CONTROL_MODE=poll`` does every
   ``MODEL_REPOSITORY_POLL_S``: the folders listed, and each folder's fingerprint, the stat of its
   manifest files, taken by ``service/models/polling.py``'s own code) of synthetic repositories of
   10, 100 and 1000 folders holding a small manifest.json each, timed in process; against ``watchfiles`` (inotify,
   recursive, its default debounce) on the same folders: how long after a folder is renamed into the
   repository it reports it, and what it costs while nothing changes. The scan also sees what another
   host writes to a shared volume (NFS, a Kubernetes PVC), which inotify never reports.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/model_loads.py` anywhere

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cli import main
from benchmarks.data import sentiment_texts
from benchmarks.load import BYPASS_CACHE, LoadPoint, RequestFn, closed_loop, merge_points
from benchmarks.memory_bursts import resident_mib
from benchmarks.options import Options
from benchmarks.repository import find_model, model_folders
from benchmarks.results import Check, Result, cores_used
from benchmarks.server import benchmark_server, providers
from harness.event_loop import run_async
from harness.http_client import HTTPConnection
from harness.service_process import ServiceProcess
from harness.stats import median, ratio
from service.settings import Settings

NAME = "model_loads"
TITLE = (
    "(n) Live model repository: load and reload times, latency while reloading, memory per model, the scan"
)
CLIENTS = 32
TARGET_RELOAD_P99 = 1.5  # p99 while reloading over steady p99, at most
RELOAD_EVERY_S = 1.0
SIZES = (10, 100, 1000)
MODES = ("steady", "reloading")
# The memory part's server trims freed heap once resident memory rests this many MiB above its lowest (the
# service's default is 32): what an unloaded model freed is handed back before the next reading instead
# of being kept by glibc and reused by the next model, which would then seem to hold nothing.
MEMORY_TRIM_MIB = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per latency window (default 5, quick 1)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="steady/reloading turns (default 3, quick 1)"
    )
    parser.add_argument(
        "--clients", type=int, default=CLIENTS, help=f"concurrent clients (default {CLIENTS})"
    )
    parser.add_argument(
        "--reload-every",
        type=float,
        default=RELOAD_EVERY_S,
        help=f"seconds between reloads in a reloading window (default {RELOAD_EVERY_S:g})",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed reloads per model (default 3, quick 1)"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="idle seconds per resident-memory reading, its lowest taken (default 5: the trimmer looks at "
        "least every 4 s; quick 0.2)",
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help=f"folders per synthetic repository (default {SIZES})",
    )


# --- the control calls and the server's figures ----------------------------------------------------


def control(server: ServiceProcess, action: str, name: str) -> tuple[int, float, str]:
    """``POST /v2/repository/models/{name}/{action}``: (status, seconds to the whole answer, its error)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    try:
        started = time.perf_counter()
        conn.request("POST", f"/v2/repository/models/{name}/{action}", body=b"")
        response = conn.getresponse()
        body = response.read()
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    error = ""
    if response.status != 200:
        try:
            error = str(json.loads(body).get("error", body[:200]))
        except (ValueError, AttributeError):
            error = body[:200].decode(errors="replace")
    return response.status, seconds, error


def metric(server: ServiceProcess, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` on /metrics whose labels include ``labels``."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def resting_mib(pid: int, seconds: float) -> float:
    """The server's lowest resident size over ``seconds`` of idleness (retired sessions freed, trims done)."""
    level = resident_mib(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.25, seconds))
        level = min(level, resident_mib(pid))
    return level


# --- 1. load times ------------------------------------------------------------------------------


def timed_load(server: ServiceProcess, name: str) -> dict[str, Any]:
    """One load (or reload) of ``name``: its status, wall seconds, and the server's own figure for it."""
    before = metric(server, "tserve_model_load_seconds_sum")
    status, seconds, error = control(server, "load", name)
    return {
        "status": status,
        "seconds": seconds,
        "server_s": metric(server, "tserve_model_load_seconds_sum") - before if status == 200 else None,
        "error": error,
    }


def load_times(
    server: ServiceProcess, names: list[str], served: str, repeats: int
) -> dict[str, dict[str, Any]]:
    """Per model: the first load, reloads while it serves, an unload, and a load after the unload; the
    server is left serving ``served`` alone."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == served:
            out[name] = {"reloads": [timed_load(server, name) for _ in range(repeats)]}
            continue
        first = timed_load(server, name)
        row: dict[str, Any] = {"first": first}
        if first["status"] == 200:
            row["reloads"] = [timed_load(server, name) for _ in range(repeats)]
            status, seconds, error = control(server, "unload", name)
            row["unload"] = {"status": status, "seconds": seconds, "error": error}
            row["again"] = timed_load(server, name)
            if row["again"]["status"] == 200:
                control(server, "unload", name)
        out[name] = row
    return out


def _ms(load: dict[str, Any] | None) -> str:
    if load is None:
        return ""
    if load["status"] != 200:
        return f"{load['status']}: {load['error']}"
    return f"{load['seconds'] * 1e3:.0f}"


def _load_rows(times: dict[str, dict[str, Any]]) -> list[str]:
    rows = [
        "| model | first load (ms) | server's own figure (ms) | reload while serving (ms, median) | "
        "unload (ms) | load after unload (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in times.items():
        first = row.get("first")
        server_ms = f"{first['server_s'] * 1e3:.0f}" if first and first["server_s"] is not None else ""
        reloads = [r for r in row.get("reloads", []) if r["status"] == 200]
        failed = [r for r in row.get("reloads", []) if r["status"] != 200]
        reload_ms = f"{median([r['seconds'] for r in reloads]) * 1e3:.0f}" if reloads else ""
        if failed:
            reload_ms += f" ({len(failed)} failed: {failed[0]['status']} {failed[0]['error']})"
        unload = row.get("unload")
        unload_ms = "" if unload is None else _ms(unload)
        label = name if first is not None else f"{name} (serving from the start: reloads only)"
        rows.append(
            f"| {label} | {_ms(first)} | {server_ms} | {reload_ms} | {unload_ms} | {_ms(row.get('again'))} |"
        )
    return rows


# --- 2. latency while reloading -----------------------------------------------------------------


def classify_request(texts: list[str]) -> RequestFn:
    async def request(conn: HTTPConnection, i: int) -> tuple[int, dict[str, float]]:
        try:
            response = await conn.request(
                "POST", "/v1/classify", {"text": texts[i % len(texts)]}, BYPASS_CACHE
            )
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            return 0, {}  # no answer at all: counted with the non-200 answers
        return response.status, {}

    return request


async def reloads_every(
    server: ServiceProcess, name: str, delay_s: float, duration_s: float, period_s: float
) -> list[tuple[int, float]]:
    """After ``delay_s`` (the clients' warm-up), reload ``name`` every ``period_s`` (or back to back when a
    reload takes longer) for ``duration_s``: each reload's (status, seconds)."""
    await asyncio.sleep(delay_s)
    conn = HTTPConnection("127.0.0.1", server.port, timeout_s=600)
    done: list[tuple[int, float]] = []
    until = time.perf_counter() + duration_s
    next_at = time.perf_counter()
    try:
        while next_at < until:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            started = time.perf_counter()
            try:
                response = await conn.request("POST", f"/v2/repository/models/{name}/load", {})
                status = response.status
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
                status = 0
            done.append((status, time.perf_counter() - started))
            next_at = max(next_at + period_s, time.perf_counter())
    finally:
        await conn.close()
    return done


async def window(
    server: ServiceProcess,
    request: RequestFn,
    clients: int,
    duration_s: float,
    warmup_s: float,
    reload: tuple[str, float] | None,
) -> tuple[LoadPoint, list[tuple[int, float]]]:
    """One closed-loop window; with ``reload`` (model, period), the model reloaded throughout it."""
    load = closed_loop(server, clients, request, duration_s=duration_s, warmup_s=warmup_s)
    if reload is None:
        return await load, []
    name, period = reload
    point, reloads = await asyncio.gather(load, reloads_every(server, name, warmup_s, duration_s, period))
    return point, reloads


# --- 3. resident memory per model ---------------------------------------------------------------


def memory_per_model(opts: Options, names: list[str], served: str, settle_s: float) -> dict[str, Any]:
    """Each model loaded alone, then unloaded, on a fresh server of its own whose trimmer hands freed heap
    back at 1 MiB (MEMORY_TRIM_MIB): the server's resting RSS before, loaded, and after the unload."""
    env = {"MODEL_CONTROL_MODE": "explicit", "SERVED_MODELS": served, "MALLOC_TRIM_MIB": str(MEMORY_TRIM_MIB)}
    with benchmark_server(opts.models, opts, env=env) as server:
        assert server.proc is not None
        pid = server.proc.pid
        control(server, "unload", served)  # every model measured alone, the classifier too
        before = resting_mib(pid, settle_s)
        start = before
        out: dict[str, Any] = {}
        for name in names:
            status, _, error = control(server, "load", name)
            if status != 200:
                out[name] = {"error": f"{status}: {error}"}
                continue
            loaded = resting_mib(pid, settle_s)
            control(server, "unload", name)
            after = resting_mib(pid, settle_s)
            out[name] = {"before_mib": before, "loaded_mib": loaded, "after_unload_mib": after}
            before = after
    return {"models": out, "start_mib": start, "end_mib": before}


def _memory_rows(memory: dict[str, Any]) -> list[str]:
    rows = [
        "| model | before (MiB) | loaded (MiB) | held (MiB) | after unload (MiB) | given back (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in memory["models"].items():
        if "error" in m:
            rows.append(f"| {name} | not loaded: {m['error']} | | | | |")
            continue
        rows.append(
            f"| {name} | {m['before_mib']:.1f} | {m['loaded_mib']:.1f} | "
            f"{m['loaded_mib'] - m['before_mib']:+.1f} | {m['after_unload_mib']:.1f} | "
            f"{m['loaded_mib'] - m['after_unload_mib']:+.1f} |"
        )
    return rows


# --- 4. a plain scan against a file watcher -------------------------------------------------------


def synthetic_repository(root: Path, folders: int) -> None:
    """``folders`` model folders, each with a small manifest.json (what a scan stats, never reads)."""
    root.mkdir(parents=True)
    for i in range(folders):
        folder = root / f"model-{i:04d}"
        folder.mkdir()
        manifest = {"name": folder.name, "task": "text-classification", "version": f"{i:016x}", "files": {}}
        (folder / "manifest.json").write_text(json.dumps(manifest))


def scan_cost(root: Path, repeats: int) -> dict[str, float]:
    """One plain scan when nothing changed, as the poller does it: the folders listed, each folder's
    fingerprint (the stat of its manifest files) taken by ``RepositoryPoller``'s own code."""
    from service.models.loading import Loader
    from service.models.polling import RepositoryPoller

    loader = Loader(Settings(model_repository=root))
    poller = RepositoryPoller(cast(Any, None), loader, interval_s=1.0)  # no core: nothing is loaded

    def scan() -> int:
        return sum(poller._fingerprint(name) is not None for name in loader.folders())

    found = scan()  # the directory entries cached, as they are between two scans of a running service
    walls, cpus = [], []
    for _ in range(repeats):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        scan()
        walls.append(time.perf_counter() - wall0)
        cpus.append(time.process_time() - cpu0)
    return {"folders_seen": found, "wall_ms": median(walls) * 1e3, "cpu_ms": statistics.mean(cpus) * 1e3}


def watcher_cost(root: Path, staging: Path, renames: int, idle_s: float) -> dict[str, Any]:
    """``watchfiles`` on ``root`` (recursive, as a watch for manifest rewrites must be): its set-up (until a
    first change is reported), its CPU while idle, and how long after a folder is renamed into ``root``
    it reports it."""
    import watchfiles

    seen: queue.Queue[tuple[float, set[tuple[Any, str]]]] = queue.Queue()
    stop = threading.Event()

    def watch() -> None:
        for changes in watchfiles.watch(root, stop_event=stop, rust_timeout=500):
            seen.put((time.perf_counter(), changes))

    def wait_for(fragment: str, timeout_s: float) -> float | None:
        deadline = time.perf_counter() + timeout_s
        while (left := deadline - time.perf_counter()) > 0:
            try:
                at, changes = seen.get(timeout=left)
            except queue.Empty:
                return None
            if any(fragment in path for _, path in changes):
                return at
        return None

    started = time.perf_counter()
    thread = threading.Thread(target=watch, name="watchfiles", daemon=True)
    thread.start()
    ready_at = None
    for k in range(200):  # until a change is reported: the watches are set up
        (root / f"probe-{k}").write_text("x")
        ready_at = wait_for(f"probe-{k}", 0.1)
        if ready_at is not None:
            break
    time.sleep(0.3)
    while not seen.empty():
        seen.get()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(idle_s)  # this thread asleep: what the process burns is the watcher's
    idle_cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    latencies: list[float] = []
    missed = 0
    for k in range(renames):
        source = staging / f"published-{k}"
        source.mkdir()
        (source / "manifest.json").write_text(json.dumps({"name": source.name, "version": f"{k:016x}"}))
        renamed_at = time.perf_counter()
        os.rename(source, root / f"new-model-{k}")
        at = wait_for(f"new-model-{k}", 10.0)
        if at is None:
            missed += 1
        else:
            latencies.append(at - renamed_at)
        time.sleep(0.1)
    stop.set()
    thread.join(timeout=10)
    return {
        "setup_ms": (ready_at - started) * 1e3 if ready_at is not None else float("nan"),
        "idle_cores": idle_cores,
        "detect_ms": [t * 1e3 for t in latencies],
        "missed": missed,
    }


def watch_choice(sizes: list[int], repeats: int, renames: int, idle_s: float) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for size in sizes:
        base = Path(tempfile.mkdtemp(prefix="bench-scan-"))
        try:
            root, staging = base / "repository", base / "staging"
            synthetic_repository(root, size)
            staging.mkdir()
            out[size] = {
                "scan": scan_cost(root, repeats),
                "watchfiles": watcher_cost(root, staging, renames, idle_s),
            }
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return out


def _scan_rows(choice: dict[int, dict[str, Any]], poll_s: float) -> list[str]:
    rows = [
        "| folders | plain scan: wall (ms, median) | its CPU (ms) | CPU at one scan per "
        f"{poll_s:g} s (% of a core) | watchfiles: set-up (ms) | reports a renamed-in folder after (ms, "
        "median / max) | its CPU while idle (% of a core) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, c in choice.items():
        scan, watch = c["scan"], c["watchfiles"]
        detect = watch["detect_ms"]
        detected = f"{median(detect):.0f} / {max(detect):.0f}" if detect else "never"
        if watch["missed"]:
            detected += f" ({watch['missed']} missed)"
        rows.append(
            f"| {size} | {scan['wall_ms']:.2f} | {scan['cpu_ms']:.2f} | {scan['cpu_ms'] / 1e3 / poll_s * 100:.3f} | "
            f"{watch['setup_ms']:.0f} | {detected} | {watch['idle_cores'] * 100:.3f} |"
        )
    return rows


# --- the run ----------------------------------------------------------------------------------------


def profiles(folders: list[Path]) -> set[str]:
    """The export profile (tiny, default...) each model was built with, from its manifest."""
    found = set()
    for folder in folders:
        try:
            found.add(str(json.loads((folder / "manifest.json").read_text())["training"]["profile"]))
        except (OSError, ValueError, KeyError, TypeError):
            found.add("unknown")
    return found


def run(opts: Options) -> Result:
    folders = model_folders(opts.models)
    served = find_model(opts.models, "text-classification").name
    names = [f.name for f in folders]
    clients = int(opts.extra.get("clients") or CLIENTS)
    duration = opts.extra.get("duration") or (1.0 if opts.quick else 5.0)
    rounds = opts.extra.get("rounds") or (1 if opts.quick else 3)
    period = float(opts.extra.get("reload_every") or RELOAD_EVERY_S)
    repeats = opts.extra.get("repeats") or (1 if opts.quick else 3)
    settle = opts.extra.get("settle") or (0.2 if opts.quick else 5.0)
    sizes = opts.extra.get("sizes") or list(SIZES)
    warmup = 0.2 if opts.quick else 1.0
    texts = sentiment_texts()
    request = classify_request(texts)

    runs: dict[str, list[LoadPoint]] = {m: [] for m in MODES}
    per_window: list[list[tuple[int, float]]] = []  # each reloading window's reloads: (status, seconds)
    # First, on a server of its own: what each model holds, before any churn of the heap.
    memory = memory_per_model(opts, names, served, settle)
    env = {"MODEL_CONTROL_MODE": "explicit", "SERVED_MODELS": served}
    with benchmark_server(opts.models, opts, env=env) as server:
        assert server.proc is not None
        provider = providers(server)
        times = load_times(server, [served, *(n for n in names if n != served)], served, repeats)

        loads_before = metric(server, "tserve_model_loads_total", result="loaded")
        rss_before = resting_mib(server.proc.pid, settle)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                point, done = run_async(
                    window(
                        server,
                        request,
                        clients,
                        duration,
                        warmup,
                        (served, period) if mode == "reloading" else None,
                    )
                )
                runs[mode].append(point)
                if mode == "reloading":
                    per_window.append(done)
        rss_after = resting_mib(server.proc.pid, settle)
        loads_seen = metric(server, "tserve_model_loads_total", result="loaded") - loads_before
    choice = watch_choice(
        sizes,
        repeats=5 if opts.quick else 20,
        renames=2 if opts.quick else 5,
        idle_s=0.3 if opts.quick else 3.0,
    )

    reloads = [r for done in per_window for r in done]
    merged = {m: merge_points(ps) for m, ps in runs.items()}
    steady, reloading = merged["steady"], merged["reloading"]
    p99_ratio = ratio(reloading.p(99), steady.p(99))
    errors = reloading.errors
    reload_ok = [s for status, s in reloads if status == 200]
    reload_failed = [status for status, _ in reloads if status != 200]
    poll_s = float(Settings.model_fields["model_repository_poll_s"].default)

    metrics: dict[str, Any] = {
        f"reload_p99_over_steady_{clients}": p99_ratio,
        "steady_p50_ms": steady.p(50) * 1e3,
        "steady_p99_ms": steady.p(99) * 1e3,
        "reloading_p50_ms": reloading.p(50) * 1e3,
        "reloading_p99_ms": reloading.p(99) * 1e3,
        "steady_rps": steady.rps,
        "reloading_rps": reloading.rps,
        "errors_while_reloading": errors,
        "errors_steady": steady.errors,
        "statuses_while_reloading": reloading.statuses,
        "reloads": len(reloads),
        "reloads_failed": len(reload_failed),
        "reload_ms_median": median(reload_ok) * 1e3,
        "reloads_counted_by_server": loads_seen,
        "rss_growth_over_reloads_mib": rss_after - rss_before,
        "load_ms": {
            n: row["first"]["seconds"] * 1e3
            for n, row in times.items()
            if row.get("first") and row["first"]["status"] == 200
        },
        "reload_ms": {
            n: median([r["seconds"] for r in row.get("reloads", []) if r["status"] == 200]) * 1e3
            for n, row in times.items()
        },
        "load_statuses": {n: row["first"]["status"] for n, row in times.items() if row.get("first")},
        "resident_mib": {
            n: m["loaded_mib"] - m["before_mib"] for n, m in memory["models"].items() if "error" not in m
        },
        "scan_ms": {size: c["scan"]["wall_ms"] for size, c in choice.items()},
        "scan_cpu_ms": {size: c["scan"]["cpu_ms"] for size, c in choice.items()},
        "watchfiles_detect_ms": {size: median(c["watchfiles"]["detect_ms"]) for size, c in choice.items()},
        "watchfiles_idle_cores": {size: c["watchfiles"]["idle_cores"] for size, c in choice.items()},
        "clients": clients,
        "duration_s": duration,
        "rounds": rounds,
        "reload_every_s": period,
        "model": served,
        "models": names,
        "profiles": sorted(profiles(folders)),
    }

    built = profiles(folders)
    which = (
        "the **tiny test models** (every manifest's training profile is `tiny`: built in seconds for the "
        "tests; their figures describe the service's machinery, not production-sized models)"
        if built == {"tiny"}
        else f"models built with the profile(s) {', '.join(sorted(built))}"
    )
    latency_rows = [
        "| window | round | requests/s | p50 (ms) | p99 (ms) | non-200 | reloads (200 / all) | reload (ms, median) | "
        "server cores | client cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        for r, p in enumerate(runs[mode], 1):
            done = per_window[r - 1] if mode == "reloading" else []
            ok = [seconds for status, seconds in done if status == 200]
            counts = f"{len(ok)} / {len(done)}" if mode == "reloading" else ""
            reload_ms = f"{median(ok) * 1e3:.0f}" if ok else ""
            latency_rows.append(
                f"| {mode} | {r} | {p.rps:.1f} | {p.p(50) * 1e3:.1f} | {p.p(99) * 1e3:.1f} | {p.errors} | "
                f"{counts} | {reload_ms} | {cores_used(p.server_cpu_s, p.seconds)} | "
                f"{cores_used(p.client_cpu_s, p.seconds)} |"
            )
    for mode, p in merged.items():
        counts = f"{len(reload_ok)} / {len(reloads)}" if mode == "reloading" else ""
        reload_ms = f"{median(reload_ok) * 1e3:.0f}" if mode == "reloading" and reload_ok else ""
        latency_rows.append(
            f"| **{mode}, all rounds** | | {p.rps:.1f} | {p.p(50) * 1e3:.1f} | **{p.p(99) * 1e3:.1f}** | {p.errors} | "
            f"{counts} | {reload_ms} | {cores_used(p.server_cpu_s, p.seconds)} | "
            f"{cores_used(p.client_cpu_s, p.seconds)} |"
        )
    statuses = ", ".join(f"{s or 'no answer'}: {n}" for s, n in sorted(reloading.statuses.items()))
    m_start, m_end = memory["start_mib"], memory["end_mib"]
    details = [
        f"Models: {which}; `{served}` served from the start (`MODEL_CONTROL_MODE=explicit`, "
        f"`SERVED_MODELS={served}`), the service's other defaults (warm-up on, response cache on but bypassed).",
        "",
        "**Load times while serving** (`POST /v2/repository/models/{name}/load`, the wall clock to the whole "
        "answer; the server's own figure is the growth of `tserve_model_load_seconds_sum` over the call; "
        f"reloads: the model loaded again while it serves, {repeats} time(s)):",
        "",
        *_load_rows(times),
        "",
        f"**Latency while reloading** (`/v1/classify` at {clients} closed-loop clients, one SST-2 sentence per "
        f"request ({len(texts)} in rotation), `Cache-Control: no-cache, no-store`; {rounds} round(s) of a steady "
        f"and a reloading window of {duration:g} s each (after {warmup:g} s of warm-up), taking turns, the order "
        f"swapped every round; in a reloading window `{served}` is reloaded every {period:g} s through the HTTP "
        "route):",
        "",
        *latency_rows,
        "",
        f"p99 reloading over steady: **{p99_ratio:.2f}x** (p50: {ratio(reloading.p(50), steady.p(50)):.2f}x). "
        f"Answers while reloading: {statuses or 'none'}; **non-200: {errors}**"
        + (f" (reloads that failed: {reload_failed})" if reload_failed else "")
        + f". The server counted {loads_seen:.0f} loads over the windows (tserve_model_loads_total); its "
        f"resting RSS moved {rss_after - rss_before:+.1f} MiB over the {len(reloads)} reloads "
        f"({rss_before:.1f} -> {rss_after:.1f} MiB).",
        "",
        f"**Resident memory per model** (VmRSS of a server of its own, started first, `MALLOC_TRIM_MIB="
        f"{MEMORY_TRIM_MIB}` so that what an unloaded model freed is handed back before the next reading; the "
        f"lowest over {settle:g} idle s for each reading; each model loaded alone, `{served}` unloaded first; "
        "'held' is loaded minus before, 'given back' is loaded minus after the unload):",
        "",
        *_memory_rows(memory),
        "",
        f"Resting RSS with no model loaded: {m_start:.1f} MiB before the first load, {m_end:.1f} MiB after the "
        "last unload. With the default MALLOC_TRIM_MIB (32) glibc keeps what an unloaded model smaller than that "
        "freed, for the process's next allocations: RSS then stays where it was (the reload figure above).",
        "",
        f"**The repository watch**: one plain scan when nothing changed (`MODEL_CONTROL_MODE=poll` scans "
        f"every MODEL_REPOSITORY_POLL_S, default {poll_s:g} s: the folders listed, each folder's "
        "fingerprint (the stat of its manifest files) taken by `RepositoryPoller`'s own code; median of the "
        "scans, CPU averaged) against `watchfiles` "
        "(inotify, recursive, default debounce: it reports a change once 50 ms pass without another) "
        "watching the same synthetic repository (one small manifest.json per folder) for a folder renamed "
        "into it:",
        "",
        *_scan_rows(choice, poll_s),
        "",
        f"The scan finds a new folder within one interval ({poll_s:g} s at most, half on average) plus the "
        "scan; watchfiles in a fraction of a second, but only for changes made through this host's kernel: "
        "a folder written by another host to a shared volume (NFS, a Kubernetes PVC) raises no inotify event "
        "here, while a stat sees it. On NFS each stat is a round trip unless the attribute cache answers, so "
        "a scan there costs more than this local one. Synthetic repositories in a temporary folder on "
        f"{_filesystem(Path(tempfile.gettempdir()))}.",
    ]
    checks = [
        Check(f"p99 while reloading over steady, {clients} clients", p99_ratio, TARGET_RELOAD_P99, False),
        Check("non-200 answers while reloading", float(errors), 0, higher_is_better=False, unit=""),
    ]
    return Result(NAME, TITLE, metrics, checks, details, {"provider": provider})


def _filesystem(path: Path) -> str:
    """The file system type of ``path``'s mount (from /proc/mounts), in a few words."""
    best, kind = "", "an unknown file system"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        mount = fields[1] if len(fields) > 2 else ""
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if mount and inside and len(mount) > len(best):
            best, kind = mount, f"{fields[2]} (`{mount}`)"
    return kind


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
