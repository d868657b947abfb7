"""The autoscaler's signal, evaluated by a real Prometheus: the KEDA ScaledObject's own queries rise above their
thresholds under load, so KEDA would scale out, and fall below them once the load stops, so it would scale in;
so does the prometheus-adapter rule deploy/k8s/hpa-cpu/hpa.yaml gives for a plain HPA (read from its comment).

Debian's ``prometheus`` server scrapes two ``python -m service`` replicas on loopback with the scrape settings
deploy/prometheus/prometheus.yml ships for the api (its job's path and interval; static targets in place of
compose's DNS discovery, labelled ``namespace`` and ``pod`` as Kubernetes' pod discovery labels them, which is
what the queries select on). The queries, thresholds, replica bounds and polling interval are read from
deploy/k8s/scaledobject.yaml, never copied here; each is evaluated through Prometheus's HTTP API
(``/api/v1/query``), as KEDA's Prometheus scaler does. The load is bounded: 96 closed-loop connections for a
fixed time, classify requests of 4 texts each against replicas that batch 2 items at a time, so work
waits: up to 384 items, 12 times the queue-depth threshold of the 2 replicas, and few enough to drain
within the scale-in window on a machine whose cores are shared (with 16 texts, 646 items were still
queued 20 s after the load, there). The load comes from wrk (benchmarks/request_path.py's script), not from Python clients in the test's
own event loop: on a machine whose other core was busy, 96 httpx clients could not keep more than 24
requests in flight, so the in-flight signal measured the clients, not the replicas. The figures (printed
with ``-s``) are in docs/DEPLOYMENT.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from servers import metric

from benchmarks.request_path import _WRK_SCRIPT, Load, wrk_load
from harness.ports import free_port
from harness.service_process import ServiceProcess

REPO = Path(__file__).resolve().parents[1]
SCALED_OBJECT = REPO / "deploy" / "k8s" / "scaledobject.yaml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
HPA = REPO / "deploy" / "k8s" / "hpa-cpu" / "hpa.yaml"
NAMESPACE = "default"
POD_NAMES = ("transformer-serving-7d9f8-0", "transformer-serving-7d9f8-1")
CLIENTS = 96  # in flight at once: 4x the in-flight threshold of 24 per replica, 2x the 2 replicas
TEXTS_PER_REQUEST = 4
LOAD_S = 30.0

pytestmark = [pytest.mark.slow, pytest.mark.deploy]


def _triggers() -> list[dict[str, Any]]:
    spec = yaml.safe_load(SCALED_OBJECT.read_text())["spec"]
    return [t for t in spec["triggers"] if t["type"] == "prometheus"]


def _spec() -> dict[str, Any]:
    return dict(yaml.safe_load(SCALED_OBJECT.read_text())["spec"])


def _shipped_job() -> dict[str, Any]:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "transformer-serving"]
    return dict(job)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in sorted(units, key=len, reverse=True):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(duration)


def _adapter_rule() -> tuple[str, float]:
    """The prometheus-adapter rule deploy/k8s/hpa-cpu/hpa.yaml gives users (in its comments) for queue depth
    as a per-pod metric, expanded as the adapter does for an HPA's Pods metric over this test's pods, and
    the HPA target it pairs with (AverageValue per pod)."""
    comment = [line[1:] for line in HPA.read_text().splitlines() if line.startswith("#")]
    start = comment.index("   rules:")
    end = comment.index("", start)  # the rule ends at the first empty comment line
    (rule,) = yaml.safe_load("\n".join(line[3:] for line in comment[start:end]))["rules"]
    series = rule["seriesQuery"].split("{")[0]
    pods = "|".join(POD_NAMES)
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{pods}"')
        .replace("<<.GroupBy>>", "pod")
    )
    target = re.search(r'averageValue: "(\d+)"', HPA.read_text())
    assert target is not None, "hpa.yaml's comment pairs the rule with an AverageValue target"
    return query, float(target.group(1))


class Prometheus:
    """Debian's prometheus server in the foreground, on a free loopback port, scraping ``targets``."""

    def __init__(self, targets: list[int], tmp_path: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(
                "prometheus is not installed: run `make test` (scripts/setup.sh --test-tools installs it)"
            )
        job = _shipped_job()
        config = {
            "global": {
                "scrape_interval": job["scrape_interval"],
                "evaluation_interval": job["scrape_interval"],
            },
            "scrape_configs": [
                {
                    "job_name": job["job_name"],
                    "metrics_path": job["metrics_path"],
                    "scrape_interval": job["scrape_interval"],
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}"],
                            # What Kubernetes' pod discovery (relabelled as usual) gives each pod.
                            "labels": {"namespace": NAMESPACE, "pod": POD_NAMES[i]},
                        }
                        for i, port in enumerate(targets)
                    ],
                }
            ],
        }
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.scrape_s = _seconds(job["scrape_interval"])

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited: see prometheus.log"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail("prometheus was not ready in time")

    def targets_up(self) -> int:
        active = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return sum(t["health"] == "up" for t in active)

    def series(self, promql: str) -> dict[str, float]:
        """The query's value now, per series (keyed by the series' ``pod`` label, or '' without one)."""
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5).json()
        assert body["status"] == "success", body
        return {r["metric"].get("pod", ""): float(r["value"][1]) for r in body["data"]["result"]}

    def query(self, promql: str) -> float:
        """The query's value now, as KEDA's Prometheus scaler reads it: one series (an empty result is 0)."""
        values = self.series(promql)
        assert len(values) <= 1, f"KEDA refuses a query of several series: {promql} gave {values}"
        return next(iter(values.values()), 0.0)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def replicas(tiny_models: Path, tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    env = {
        "MODEL_REPOSITORY": str(tiny_models),
        "SERVED_MODELS": "bert-classifier",
        "CACHE_ENABLED": "false",
        "MAX_BATCH_SIZE": "2",  # work waits in the queue under this load: the first trigger's signal
        "MAX_ITEMS": str(TEXTS_PER_REQUEST),
        "MAX_QUEUE_SIZE": "4096",
        "INTRA_OP_THREADS": "1",
        "ACCESS_LOG": "false",
        "API_KEYS": None,
    }
    with (
        ServiceProcess(env, log_path=tmp_path / "replica-0.log", stop_grace_s=0) as first,
        ServiceProcess(env, log_path=tmp_path / "replica-1.log", stop_grace_s=0) as second,
    ):
        yield [first, second]


def _readings(replicas: list[ServiceProcess]) -> list[dict[str, float]]:
    """Each replica's own queue depth, requests in flight and items dropped for a client gone, from its
    /metrics."""
    names = {
        "queue": "tserve_queue_depth",
        "in_flight": "tserve_http_requests_in_flight",
        "dropped": "tserve_requests_dropped_total",
    }
    return [{key: metric(replica.url, name) for key, name in names.items()} for replica in replicas]


class WrkLoad:
    """``CLIENTS`` closed-loop connections, half on each replica, for ``seconds``: one wrk per replica."""

    def __init__(self, urls: list[str], seconds: float, work: Path) -> None:
        binary = shutil.which("wrk")
        if binary is None:
            pytest.fail("wrk is not installed: run `make test` (scripts/setup.sh --test-tools installs it)")
        body = work / "classify.json"
        texts = [f"an utterly ordinary sentence, number {i}" for i in range(TEXTS_PER_REQUEST)]
        body.write_text(json.dumps({"texts": texts}))
        script = work / "load.lua"
        script.write_text(_WRK_SCRIPT)
        env = {
            **os.environ,
            "BODY_FILE": str(body),
            "BODY_HEADERS": "Content-Type:application/json\nCache-Control:no-store",
        }
        per_replica = CLIENTS // len(urls)
        command = [
            binary,
            "-t1",
            f"-c{per_replica}",
            f"-d{seconds:g}s",
            "--timeout",
            "60s",
            "-s",
            str(script),
        ]
        self.procs = [
            subprocess.Popen(
                # A request waits in the queue for seconds under this load: wrk's 2 s default would count it
                # as an error (and the replicas would still be working on it).
                [*command, f"{url}/v1/classify"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for url in urls
        ]

    def done(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def results(self) -> list[Load]:
        return [wrk_load(p.communicate()[0], 0.0) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_scaled_objects_queries_rise_over_their_thresholds_under_load_and_fall_after(
    replicas: list[ServiceProcess], tmp_path: Path
) -> None:
    spec, triggers = _spec(), _triggers()
    assert {t["name"] for t in triggers} == {"queue-depth", "requests-in-flight"}
    replicas_now = int(spec["minReplicaCount"])  # what KEDA runs before the load
    prometheus = Prometheus([r.port for r in replicas], tmp_path)
    try:
        prometheus.wait_ready()
        deadline = time.monotonic() + 4 * prometheus.scrape_s
        while prometheus.targets_up() < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert prometheus.targets_up() == 2

        peaks = {t["name"]: 0.0 for t in triggers}
        adapter_query, adapter_target = _adapter_rule()
        adapter_peak, adapter_pods = 0.0, 0
        load = WrkLoad([r.url for r in replicas], LOAD_S, tmp_path)
        try:
            while not load.done():
                for t in triggers:
                    peaks[t["name"]] = max(peaks[t["name"]], prometheus.query(t["metadata"]["query"]))
                per_pod = prometheus.series(adapter_query)
                adapter_pods = max(adapter_pods, len(per_pod))
                adapter_peak = max(adapter_peak, sum(per_pod.values()))
                time.sleep(1.0)
            results = load.results()
        finally:
            load.stop()
        # wrk counts a non-2xx answer, a timeout and a dropped connection as errors: every request got 200.
        assert all(r.requests > 0 and r.errors == 0 for r in results), results
        ended = time.monotonic()

        # Scale-in: each query below its threshold (ceil(value / threshold) <= 1 <= minReplicaCount) within
        # one polling interval and one scrape after the load stopped.
        fall_within = float(spec["pollingInterval"]) + prometheus.scrape_s
        after = {t["name"]: math.inf for t in triggers}
        fell_at: dict[str, float] = {}
        adapter_after = math.inf
        while time.monotonic() - ended < fall_within + 5 and len(fell_at) < len(triggers) + 1:
            for t in triggers:
                value = prometheus.query(t["metadata"]["query"])
                after[t["name"]] = value
                if value < float(t["metadata"]["threshold"]) and t["name"] not in fell_at:
                    fell_at[t["name"]] = time.monotonic() - ended
            adapter_after = sum(prometheus.series(adapter_query).values())
            if adapter_after < adapter_target and "adapter" not in fell_at:
                fell_at["adapter"] = time.monotonic() - ended
            time.sleep(0.5)
        # What each replica itself says, beside what Prometheus had: a gauge left stale (the queue empty,
        # its depth still reported) reads differently from work still draining.
        readings = _readings(replicas)
    finally:
        prometheus.stop()

    for t in triggers:
        name, threshold = t["name"], float(t["metadata"]["threshold"])
        wanted_under_load = math.ceil(peaks[name] / threshold)  # AverageValue: KEDA's desired replicas
        print(
            f"{name}: {t['metadata']['query']} peaked at {peaks[name]:g} under load (threshold {threshold:g} "
            f"per replica: {wanted_under_load} replicas wanted against {replicas_now}), fell to "
            f"{after[name]:g} {fell_at.get(name, math.nan):.1f} s after the load stopped"
        )
        assert wanted_under_load > replicas_now, f"{name} would not scale out: peaked at {peaks[name]}"
        assert name in fell_at, f"{name} stayed at {after[name]} after the load; the replicas read {readings}"
        assert fell_at[name] <= fall_within, f"{name} fell only after {fell_at[name]:.1f} s"

    # hpa.yaml's prometheus-adapter rule: one series per pod, an HPA Pods metric at AverageValue per pod.
    hpa_min = int(yaml.safe_load(HPA.read_text())["spec"]["minReplicas"])
    wanted = math.ceil(adapter_peak / adapter_target)
    print(
        f"hpa.yaml's adapter rule: {adapter_query} summed over its {adapter_pods} pods peaked at "
        f"{adapter_peak:g} (target {adapter_target:g} per pod: {wanted} replicas wanted against {hpa_min}), "
        f"fell to {adapter_after:g} {fell_at.get('adapter', math.nan):.1f} s after the load stopped"
    )
    assert adapter_pods == len(POD_NAMES), "one series per pod, as an HPA Pods metric needs"
    assert wanted > hpa_min, f"the adapter's metric would not scale out: peaked at {adapter_peak}"
    assert fell_at.get("adapter", math.inf) <= fall_within, f"the adapter's metric stayed at {adapter_after}"
