"""Replicas behind a real load balancer, without containers: docker-compose.yml's `scaled` profile on loopback.

Two ``python -m service`` replicas (the tiny GPT and classifier, SERVED_MODELS) share one private
``redis-server``; Debian's ``haproxy`` runs deploy/haproxy/haproxy.cfg, the file the compose profile
mounts, with servers.local.cfg naming the two replicas. Checked: a response cached by one replica is
a hit on the other; a replica drained with SIGTERM during sustained load loses no request; one killed
with SIGKILL during sustained non-streaming load loses none either (HAProxy retries the refused and
the empty answers on the other replica), and a stream it was sending ends with an error the client
sees, never a hang; restarted, it rejoins and serves. Every load is bounded in count and time and
goes to 127.0.0.1 only. The figures (printed with ``-s``) are in docs/DEPLOYMENT.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RedisServer

from harness.ports import free_port
from harness.service_process import ServiceProcess

REPO = Path(__file__).resolve().parents[1]
HAPROXY = REPO / "deploy" / "haproxy"
CLIENTS = 6  # concurrent clients of the sustained load
REQUESTS = 60  # per client: 360 requests per load run
TIMEOUT = httpx.Timeout(60.0, connect=5.0)

pytestmark = [pytest.mark.slow, pytest.mark.deploy]


def _replica_env(models: Path, redis_url: str) -> dict[str, str | None]:
    return {
        "MODEL_REPOSITORY": str(models),
        "SERVED_MODELS": "gpt,bert-classifier",
        "REDIS_URL": redis_url,
        "DEVICE": "cpu",
        "WORKERS": "1",
        "INTRA_OP_THREADS": "1",
        "SHUTDOWN_TIMEOUT_S": "20",
        "MAX_QUEUE_SIZE": "256",
        "ACCESS_LOG": "false",
        "API_KEYS": None,
    }


class Balancer:
    """haproxy -f haproxy.cfg -f servers.local.cfg in the foreground, on free loopback ports."""

    def __init__(self, replicas: list[ServiceProcess], log_path: Path) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            pytest.fail(
                "haproxy is not installed: run `make test` (scripts/setup.sh --test-tools installs it)"
            )
        self.port, self.stats_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "LB_BIND": f"127.0.0.1:{self.port}",
            "LB_STATS_BIND": f"127.0.0.1:{self.stats_port}",
            "API_1": f"127.0.0.1:{replicas[0].port}",
            "API_2": f"127.0.0.1:{replicas[1].port}",
        }
        config = [str(HAPROXY / "haproxy.cfg"), str(HAPROXY / "servers.local.cfg")]
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [binary, "-db", "-f", config[0], "-f", config[1]], env=env, stdout=self.log, stderr=self.log
        )

    def servers_up(self) -> dict[str, bool]:
        """Server name -> UP, from HAProxy's Prometheus exporter."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.stats_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return {}
        up: dict[str, bool] = {}
        for line in text.splitlines():
            if line.startswith("haproxy_server_status{") and 'proxy="api"' in line:
                server = line.split('server="')[1].split('"')[0]
                state = line.split('state="')[1].split('"')[0]
                if float(line.rsplit(" ", 1)[1]) == 1:
                    up[server] = state == "UP"
        return up

    def wait_until(self, wanted: dict[str, bool], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}")
            up = self.servers_up()
            if all(up.get(name) == state for name, state in wanted.items()):
                return
            time.sleep(0.1)
        raise TimeoutError(f"haproxy did not see {wanted} within {timeout_s} s: {self.servers_up()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


class Cluster:
    def __init__(self, models: Path, workdir: Path, **settings: str) -> None:
        self.redis = RedisServer(workdir)
        self.redis.start()
        env = {**_replica_env(models, self.redis.url), **settings}
        self.replicas = [
            ServiceProcess(env, log_path=workdir / f"api{i + 1}.log", stop_grace_s=40) for i in range(2)
        ]
        self.balancer: Balancer | None = None
        self.workdir = workdir

    def start(self) -> Cluster:
        for replica in self.replicas:
            replica.start(ready_timeout_s=300)
        self.balancer = Balancer(self.replicas, self.workdir / "haproxy.log")
        self.balancer.wait_until({"api1": True, "api2": True})
        return self

    def close(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        for replica in self.replicas:
            replica.stop(grace_s=0)
        self.redis.stop()


@pytest.fixture
def cluster(tiny_models: Path, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tiny_models, tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.close()


def _served_by(response: httpx.Response) -> str:
    return response.headers.get("x-served-by", "")


def _sustained_load(url: str, halfway: threading.Event) -> Counter[Any]:
    """CLIENTS x REQUESTS seeded, sampled (so uncached) generate requests; ``halfway`` set at a third."""
    done = Counter[Any]()
    lock = threading.Lock()
    total = CLIENTS * REQUESTS

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=TIMEOUT) as http:
            for n in range(REQUESTS):
                body = {
                    "prompt": "KING:",
                    "max_new_tokens": 8,
                    "temperature": 0.9,
                    "seed": index * 10_000 + n,
                }
                try:
                    response = http.post("/v1/generate", json=body)
                    outcome: Any = (response.status_code, _served_by(response))
                except httpx.HTTPError as error:
                    outcome = (type(error).__name__, "")
                with lock:
                    done[outcome] += 1
                    if sum(done.values()) >= total // 3:
                        halfway.set()

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    return done


def _statuses(outcomes: Counter[Any]) -> Counter[Any]:
    return Counter(
        {status: sum(n for (s, _), n in outcomes.items() if s == status) for status, _ in outcomes}
    )


def test_a_response_cached_by_one_replica_is_a_hit_on_the_other(cluster: Cluster) -> None:
    texts = [f"replica cache check {i}: a fine, warm film" for i in range(20)]
    first, second = (httpx.Client(base_url=r.url, timeout=TIMEOUT) for r in cluster.replicas)
    with first, second:
        misses = [first.post("/v1/classify", json={"text": t}).json()["cached"] for t in texts]
        hits = [second.post("/v1/classify", json={"text": t}).json()["cached"] for t in texts]
    assert not any(misses)
    assert all(hits), f"{sum(hits)} of {len(texts)} were hits on the other replica"
    print(f"\ncache hits across replicas: {sum(hits)} of {len(texts)}")

    # Through the balancer: whichever replica answers the repeat, it is a hit.
    assert cluster.balancer is not None
    with httpx.Client(base_url=cluster.balancer.url, timeout=TIMEOUT) as http:
        body = {"prompt": "KING:", "max_new_tokens": 6, "seed": 7, "temperature": 0.8}
        answers = [http.post("/v1/generate", json=body) for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 6
    assert [a.json()["cached"] for a in answers] == [False] + [True] * 5
    assert len({json.dumps(a.json()["results"]) for a in answers}) == 1
    assert {_served_by(a) for a in answers} <= {"api1", "api2"}


def test_a_replica_drained_under_load_loses_no_request(cluster: Cluster) -> None:
    assert cluster.balancer is not None
    replica = cluster.replicas[0]
    halfway = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(_sustained_load, cluster.balancer.url, halfway)
        assert halfway.wait(timeout=300), "the load did not get going"
        proc = replica.proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGTERM)  # what Kubernetes and `docker stop` send
        exit_code = proc.wait(timeout=60)
        outcomes = load.result(timeout=600)
    replica.proc = None
    statuses = _statuses(outcomes)
    served_by = Counter(s for (_, s), n in outcomes.items() for _ in range(n))
    print(f"\ndrain under load: {dict(statuses)}; served by {dict(served_by)}")
    assert statuses == Counter({200: CLIENTS * REQUESTS}), f"requests lost on drain: {dict(statuses)}"
    assert exit_code == 0
    assert "draining: readiness is 503" in replica.log()
    assert "drain deadline reached" not in replica.log()


def _stream(url: str, on_headers: threading.Event, served: list[str]) -> tuple[str, int]:
    """One streamed generation through the balancer: ('complete'|'cut'|'timeout'|..., events read).

    ``on_headers`` is set at the first event, ``served`` gets the replica that answers."""
    body = {"prompt": "KING:", "max_new_tokens": 48, "temperature": 1.0, "seed": 3, "stream": True}
    events = 0
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0)) as http,
            http.stream("POST", f"{url}/v1/generate", json=body) as response,
        ):
            served.append(_served_by(response))
            on_headers.set()
            final = False
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events += 1
                    payload = line[5:].strip()
                    if payload and payload != "[DONE]" and "finish_reason" in json.loads(payload):
                        final = True
            return ("complete" if final else "ended-without-final-event", events)
    except httpx.TimeoutException:
        return ("timeout", events)
    except httpx.HTTPError as error:
        return (f"cut:{type(error).__name__}", events)


def _restart(victim: ServiceProcess, balancer: Balancer) -> float:
    """Start the killed replica again; seconds from spawn until the balancer has it back in rotation."""
    started = time.perf_counter()
    victim.start(ready_timeout_s=300)
    balancer.wait_until({"api2": True})
    return time.perf_counter() - started


@contextlib.contextmanager
def _throttled(replica: ServiceProcess, run_s: float = 0.001, pause_s: float = 0.05) -> Iterator[None]:
    """The replica slowed to a few percent of a core: SIGSTOP and SIGCONT in turn, until the block ends."""
    stop = threading.Event()
    proc = replica.proc
    assert proc is not None

    def pulse() -> None:
        while not stop.is_set() and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGSTOP)
                time.sleep(pause_s)
                os.killpg(proc.pid, signal.SIGCONT)
            time.sleep(run_s)

    thread = threading.Thread(target=pulse, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)


def _kill(victim: ServiceProcess) -> None:
    assert victim.proc is not None
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    victim.proc = None


def test_a_killed_replica_loses_no_request_cuts_its_streams_cleanly_and_rejoins(cluster: Cluster) -> None:
    assert cluster.balancer is not None
    balancer = cluster.balancer
    victim = cluster.replicas[1]

    # A stream the victim is sending when it dies, killed after its first event. The tiny model decodes
    # its 48 tokens in milliseconds, so the victim is slowed down meanwhile (_throttled) for the kill to
    # land mid-stream. Bounded tries: leastconn may give a stream to the other replica, and a stream may
    # still finish before the kill.
    outcome, events, tries = "", 0, 0
    while tries < 12 and not outcome.startswith("cut"):
        tries += 1
        on_headers, served = threading.Event(), []
        with ThreadPoolExecutor(1) as pool, _throttled(victim):
            stream = pool.submit(_stream, balancer.url, on_headers, served)
            assert on_headers.wait(timeout=60)
            if served[0] != "api2":
                stream.result(timeout=90)
                continue
            _kill(victim)
        outcome, events = stream.result(timeout=90)  # never a hang: 90 s at most
        print(f"\nstream cut by SIGKILL: {outcome} after {events} event(s)")
        assert outcome != "timeout", "a stream cut by a crash must end with an error, not hang"
        assert outcome != "ended-without-final-event", "a cut stream must end in an error the client sees"
        balancer.wait_until({"api2": False})
        rejoin_s = _restart(victim, balancer)
    assert outcome.startswith("cut:"), f"no stream was cut mid-way in {tries} tries"

    # Sustained non-streaming load, the victim killed a third of the way in: all answered, by retries.
    print(f"restart: ready in {victim.ready_s:.1f} s, back in the balancer's rotation in {rejoin_s:.1f} s")
    halfway = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(_sustained_load, balancer.url, halfway)
        assert halfway.wait(timeout=300), "the load did not get going"
        _kill(victim)
        outcomes = load.result(timeout=600)
    statuses = _statuses(outcomes)
    served_by = Counter(s for (_, s), n in outcomes.items() for _ in range(n))
    print(f"SIGKILL under load: {dict(statuses)}; served by {dict(served_by)}")
    assert statuses == Counter({200: CLIENTS * REQUESTS}), f"requests lost on SIGKILL: {dict(statuses)}"
    assert served_by["api2"] > 0, "the victim served part of the load before it died"

    # Restarted, it rejoins and serves through the balancer.
    rejoin_s = _restart(victim, balancer)
    print(f"restart after SIGKILL: ready in {victim.ready_s:.1f} s, in rotation in {rejoin_s:.1f} s")
    with httpx.Client(base_url=balancer.url, timeout=TIMEOUT) as http:
        answers = [http.post("/v1/classify", json={"text": f"rejoined {i}"}) for i in range(20)]
    assert [a.status_code for a in answers] == [200] * 20
    assert any(_served_by(a) == "api2" for a in answers), "the restarted replica serves no request"


# --- a new version published to the shared repository, rolled out by each replica's poll -------------


def _rollout_load(url: str, stop: threading.Event, seen: list[tuple[str, str, str, int]]) -> None:
    """One client of the rollout: classify and stream in turn until ``stop``, one request after another;
    each answer as (replica, model, version, status) in ``seen`` (this client's own list), a stream's
    version read from its last event."""
    with httpx.Client(base_url=url, timeout=TIMEOUT) as http:
        turn = 0
        while not stop.is_set():
            turn += 1
            if turn % 2:
                r = http.post("/v1/classify", json={"text": f"rollout {turn}: a fine film"})
                version = r.json().get("model_version", "") if r.status_code == 200 else ""
                seen.append((_served_by(r), "bert-classifier", version, r.status_code))
                continue
            body = {"prompt": "KING:", "max_new_tokens": 12, "temperature": 0, "stream": True}
            with http.stream("POST", "/v1/generate", json=body) as r:
                events = [line[5:] for line in r.iter_lines() if line.startswith("data:")]
            broken = any('"error"' in e for e in events)
            versions = [json.loads(e).get("model_version", "") for e in events if '"model_version"' in e]
            status = 500 if broken else r.status_code
            seen.append((_served_by(r), "gpt", versions[-1] if versions else "", status))


def test_replicas_polling_one_repository_roll_out_a_new_version_with_nothing_lost(
    tiny_models: Path, tmp_path: Path
) -> None:
    from test_model_control import publish_copy, republish

    models = tmp_path / "models"
    models.mkdir()
    for name in ("gpt", "bert-classifier"):
        shutil.copytree(tiny_models / name, models / name, ignore=shutil.ignore_patterns(".work"))
    cluster = Cluster(
        models, tmp_path, MODEL_CONTROL_MODE="poll", MODEL_REPOSITORY_POLL_S="0.3", CACHE_ENABLED="false"
    )
    try:
        cluster.start()
        assert cluster.balancer is not None
        stop = threading.Event()
        per_client: list[list[tuple[str, str, str, int]]] = [[] for _ in range(8)]
        threads = [
            threading.Thread(target=_rollout_load, args=(cluster.balancer.url, stop, answers), daemon=True)
            for answers in per_client
        ]
        for t in threads:
            t.start()
        time.sleep(2)
        new = {}
        for name in ("bert-classifier", "gpt"):  # published as the exporter does: beside, then renamed in
            copy = publish_copy(models, name)
            new[name] = republish(copy)
            shutil.rmtree(models / name)
            copy.rename(models / name)

        def on_new(replica: ServiceProcess) -> bool:
            listed = httpx.get(f"{replica.url}/v1/models", timeout=10).json()["data"]
            return {m["name"]: m.get("version") for m in listed} == new

        deadline = time.monotonic() + 120
        while not all(on_new(r) for r in cluster.replicas) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # answers from the new versions on both replicas
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert all(on_new(r) for r in cluster.replicas), "a replica did not roll to the new versions"
        seen = [answer for answers in per_client for answer in answers]
        statuses = Counter(status for *_, status in seen)
        print(f"\nrollout under load: {dict(statuses)} over {len(seen)} answers")
        assert statuses == Counter({200: len(seen)}), f"answers other than 200: {dict(statuses)}"
        for replica in ("api1", "api2"):
            for model in ("bert-classifier", "gpt"):
                assert new[model] in [v for r, m, v, _ in seen if (r, m) == (replica, model)], (
                    replica,
                    model,
                )
                # one client's requests, one after another: once a replica answered it with the new version,
                # it never answers it with the old one (the answers of concurrent clients may cross)
                for answers in per_client:
                    versions = [v for r, m, v, _ in answers if (r, m) == (replica, model)]
                    if new[model] in versions:
                        later = versions[versions.index(new[model]) :]
                        assert set(later) == {new[model]}, f"{replica} {model} went back to the old version"
    finally:
        cluster.close()
