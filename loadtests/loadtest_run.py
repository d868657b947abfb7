"""``loadtests/run``: start the service and a private Redis on loopback, run locust headless, write a report.

    loadtests/run [--duration 60s] [--users 16] [--spawn-rate N] [--mix cold|warm] [--out DIR]
                  [--models DIR] [--no-redis] [--env NAME=VALUE ...] [--host URL]
                  [--weights NAME=W,...] [--data-dir DIR] [--batch N] [--max-new-tokens N] [--pool-size N]
                  [--ready-timeout S] [-- extra locust arguments]

Without ``--host`` it starts ``redis-server`` and ``python -m service`` (MODEL_REPOSITORY = ``--models``,
default ``$MODEL_REPOSITORY`` or ``models``) on free 127.0.0.1 ports, waits for /health/ready, runs
locust for ``--duration`` and stops both, also on Ctrl-C, SIGTERM or an error (and, through
PR_SET_PDEATHSIG, if this process itself is killed). With ``--host URL`` it starts nothing and loads
that service.

The output folder (default ``artifacts/loadtest-<timestamp>/``) gets locust's CSV files
(``locust_stats.csv``, ``locust_stats_history.csv``, ``locust_failures.csv``, ``locust_exceptions.csv``),
its HTML report (``report.html``), ``summary.md`` and PNG plots (see loadtest_report.py), ``run.json``
(settings, served models, the processes started), ``load_stats.json`` (the locustfile's mix and
cache-hit counts) and the logs (``locust.log``, ``service.log``, ``redis.log``).

Exit status: locust's (0, or 1 when any request failed), 2 when the set-up failed (the service did not
get ready, no redis-server, ...), 130 after Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]  # loadtest_report, harness/
from loadtest_report import write_report  # noqa: E402

from harness.ports import free_port  # noqa: E402
from harness.processes import die_with_parent, stop_process_group  # noqa: E402
from harness.service_process import ServiceNotReady, ServiceProcess  # noqa: E402


class SetupError(RuntimeError):
    """The service or Redis could not be started or did not get ready."""


def parse_duration(text: str) -> float:
    """Locust's run-time syntax (``90``, ``90s``, ``2m``, ``1h30m``, ``1m30s``) -> seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    match = re.fullmatch(r"(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?", text)
    if not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 60s, 2m, 1m30s)")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(check: Callable[[], bool], timeout: float, what: str, alive: Callable[[], str | None]) -> None:
    """Poll ``check`` until true; SetupError when ``timeout`` passes or ``alive`` reports a dead process."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        problem = alive()
        if problem:
            raise SetupError(f"{what}: {problem}")
        time.sleep(0.25)
    raise SetupError(f"{what}: not within {timeout:.0f}s")


class Stack:
    """The processes this run started, stopped in reverse order whatever happens."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.redis: subprocess.Popen[bytes] | None = None
        self.service: ServiceProcess | None = None
        self.redis_url: str | None = None
        self.host: str | None = None
        self._logs: list[IO[bytes]] = []
        self._redis_dir: str | None = None

    def _log(self, name: str) -> IO[bytes]:
        f = (self.out / name).open("wb")
        self._logs.append(f)
        return f

    def start_redis(self) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SetupError(
                "redis-server is not installed (scripts/setup.sh installs it); or pass --no-redis"
            )
        port = free_port()
        self._redis_dir = tempfile.mkdtemp(prefix="loadtest-redis-")
        cmd = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._redis_dir,
            "--maxmemory", "256mb",
            "--maxmemory-policy", "allkeys-lru",
        ]  # fmt: skip
        log = self._log("redis.log")
        self.redis = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent
        )

        def pong() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_until(pong, 15, "redis-server", lambda: self._dead(self.redis, "redis.log"))
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        return self.redis_url

    def start_service(self, models: Path, env_overrides: dict[str, str], ready_timeout: float) -> str:
        # REDIS_URL: this run's private Redis, never one this process happens to have in its environment.
        env = {"MODEL_REPOSITORY": str(models), "REDIS_URL": self.redis_url, **env_overrides}
        self.service = ServiceProcess(
            env, log_path=self.out / "service.log", stop_grace_s=40, die_with_parent=True
        )
        self.host = self.service.url
        try:
            self.service.start(ready_timeout_s=ready_timeout)
        except ServiceNotReady as exc:
            raise SetupError(f"{self.host}/health/ready: {exc}") from None
        assert self.service.proc is not None
        print(
            f"loadtests/run: service pid {self.service.proc.pid} on {self.host}, models {models}", flush=True
        )
        return self.host

    def _dead(self, proc: subprocess.Popen[bytes] | None, log: str) -> str | None:
        if proc is not None and proc.poll() is not None:
            return (
                f"exited with status {proc.returncode}; the end of {self.out / log}:\n{tail(self.out / log)}"
            )
        return None

    def stop(self) -> None:
        if self.service is not None and not self.service.stop():
            print("loadtests/run: the service did not stop within 40s: killing it", file=sys.stderr)
        if not stop_process_group(self.redis, grace_s=10):
            print("loadtests/run: redis-server did not stop within 10s: killing it", file=sys.stderr)
        for f in self._logs:
            f.close()
        if self._redis_dir:
            shutil.rmtree(self._redis_dir, ignore_errors=True)


def wait_ready(host: str, timeout: float, alive: Callable[[], str | None] = lambda: None) -> None:
    def ready() -> bool:
        try:
            return http_get(f"{host}/health/ready", timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(ready, timeout, f"{host}/health/ready", alive)


def _tee(stream: IO[bytes], sink: IO[bytes], echo: bool) -> None:
    for line in iter(stream.readline, b""):
        sink.write(line)
        sink.flush()
        if echo:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()


def run_locust(args: argparse.Namespace, host: str, out: Path, extra: list[str]) -> int:
    env = dict(os.environ)
    env.update(
        {
            "LOAD_MIX": args.mix,
            "LOAD_STATS_JSON": str(out / "load_stats.json"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    for name, value in (
        ("LOCUST_WEIGHTS", args.weights),
        ("DATA_DIR", args.data_dir),
        ("LOAD_BATCH", args.batch),
        ("LOAD_MAX_NEW_TOKENS", args.max_new_tokens),
        ("LOAD_POOL_SIZE", args.pool_size),
        ("LOAD_WAIT", args.wait),
    ):
        if value is not None:
            env[name] = str(value)
    cmd = [
        sys.executable, "-m", "locust",
        "-f", str(HERE / "locustfile.py"),
        "--headless",
        "--host", host,
        "--users", str(args.users),
        "--spawn-rate", str(args.spawn_rate or args.users),
        "--run-time", args.duration,
        "--stop-timeout", str(args.stop_timeout),
        "--csv", str(out / "locust"),
        "--csv-full-history",
        "--html", str(out / "report.html"),
        "--exit-code-on-error", "1",
        *extra,
    ]  # fmt: skip
    print("loadtests/run: " + " ".join(cmd), flush=True)
    limit = parse_duration(args.duration) + args.stop_timeout + 120
    with (out / "locust.log").open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        assert proc.stdout is not None
        reader = threading.Thread(target=_tee, args=(proc.stdout, log, not args.quiet), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            print(f"loadtests/run: locust still running after {limit:.0f}s: stopping it", file=sys.stderr)
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 1
        except BaseException:
            # Ctrl-C or SIGTERM: locust's SIGTERM handler stops the users and writes its reports.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            reader.join(timeout=5)
    return rc


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    p = argparse.ArgumentParser(
        prog="loadtests/run",
        description="Start the service and a private Redis on loopback, load them with locust, write a report.",
        epilog="Arguments after -- go to locust unchanged.",
    )
    p.add_argument("--duration", "-t", default="60s", help="locust --run-time (60s, 2m, 1m30s; default 60s)")
    p.add_argument("--users", "-u", type=int, default=16, help="concurrent users (default 16)")
    p.add_argument(
        "--spawn-rate", "-r", type=float, default=None, help="users started per second (default: all at once)"
    )
    p.add_argument(
        "--mix", choices=("cold", "warm"), default="cold", help="cold: cache bypassed; warm: repeated inputs"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default artifacts/loadtest-<timestamp>/)"
    )
    p.add_argument("--host", default=None, help="load this running service (URL) and start nothing")
    p.add_argument("--models", type=Path, default=Path(os.environ.get("MODEL_REPOSITORY", "models")),
                   help="model repository for the service (default $MODEL_REPOSITORY or models)")  # fmt: skip
    p.add_argument("--no-redis", action="store_true", help="no redis-server: the service's in-process cache")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for the service, e.g. --env MAX_BATCH_SIZE=16 (repeatable)")  # fmt: skip
    p.add_argument("--weights", default=None, help="LOCUST_WEIGHTS, e.g. translate=2,generate_stream=0")
    p.add_argument("--data-dir", default=None, help="DATA_DIR for the inputs (default ../shared/data)")
    p.add_argument("--batch", type=int, default=None, help="inputs per request (LOAD_BATCH, default 1)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="LOAD_MAX_NEW_TOKENS (default 32)")
    p.add_argument("--pool-size", type=int, default=None, help="warm mix: inputs per endpoint (default 16)")
    p.add_argument("--wait", default=None, help="LOAD_WAIT think time min,max seconds (default 0.05,0.25)")
    p.add_argument("--stop-timeout", type=float, default=10, help="seconds users get to finish at the end")
    p.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for /health/ready")
    p.add_argument("--quiet", "-q", action="store_true", help="do not echo locust's output")
    args = p.parse_args(argv)
    parse_duration(args.duration)
    if args.users < 1:
        p.error("--users must be at least 1")
    for item in args.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item, flags=re.DOTALL):
            p.error(f"--env {item!r}: expected NAME=VALUE")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    started = datetime.now()
    out = args.out or ROOT / "artifacts" / f"loadtest-{started:%Y%m%d-%H%M%S}"
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (`&`)

    stack = Stack(out)
    run: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "duration": args.duration,
        "users": args.users,
        "spawn_rate": args.spawn_rate or args.users,
        "mix": args.mix,
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}",
        "argv": sys.argv[1:] if argv is None else argv,
    }
    rc = 2
    try:
        if args.host:
            host = args.host.rstrip("/")
            run.update(host=host, started_service=False, cache="the running service's own")
            wait_ready(host, args.ready_timeout)
        else:
            models = args.models.resolve()
            if not models.is_dir():
                raise SetupError(f"model repository {models} does not exist (--models DIR)")
            if not args.no_redis:
                stack.start_redis()
            env = dict(e.split("=", 1) for e in args.env)
            host = stack.start_service(models, env, args.ready_timeout)
            run.update(
                host=host,
                started_service=True,
                models_dir=str(models),
                cache=f"Redis ({stack.redis_url}, private)"
                if stack.redis_url
                else "in-process LRU (--no-redis)",
                service_env=env,
                pids={
                    "service": stack.service.proc.pid if stack.service and stack.service.proc else None,
                    "redis": stack.redis.pid if stack.redis else None,
                },
            )
        try:
            status, body = http_get(f"{host}/v1/models", timeout=10)
            run["models"] = json.loads(body).get("data", []) if status == 200 else []
        except (OSError, ValueError):
            run["models"] = []
        (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        rc = run_locust(args, host, out, extra)
    except SetupError as exc:
        print(f"loadtests/run: {exc}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt:
        print("loadtests/run: interrupted; stopping what it started", file=sys.stderr)
        rc = 130
    finally:
        try:
            stack.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: finish stopping anyway
            stack.stop()
    run["exit_code"] = rc
    run["finished"] = datetime.now().isoformat(timespec="seconds")
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    if (out / "locust_stats.csv").is_file():
        summary = write_report(out)
        print(f"\n{summary.read_text(encoding='utf-8')}")
        print(f"loadtests/run: report in {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
