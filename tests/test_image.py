"""The image, built and run: the Dockerfile through Debian's podman and buildah, as a new user on this
machine class would (no image registry reachable, only the package registries).

scripts/podman_build.sh builds ``--target service`` and the tiny runtime (the export stage trains the
tiny models inside the build, the datasets through the ``data`` build context), with the bases it makes
locally (mmdebstrap + podman import) and a private containers.conf (CONTAINERS_CONF). Then the runtime
runs: ``/health/ready``, one request per task through every door (REST, OpenAI, Open Inference v2,
streaming), the image's own HEALTHCHECK (kept: Docker format), and a stop with SIGTERM: exit 0 and the
drain log line. The container uses the host's network on a free loopback port.

Slow (minutes: docs/DEPLOYMENT.md gives the measured times), and part of `make test` and CI. The tools
come with the test path (scripts/setup.sh --test-tools, which `make test` runs), never with `make serve`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc
import yaml
from PIL import Image

from harness import podman
from harness.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TAG = "localhost/transformer-serving"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.deploy,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman and mmdebstrap need root"),
]


_podman = podman.podman


def _build(*args: str) -> float:
    missing = podman.missing_tools()
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: run `make test` (scripts/setup.sh --test-tools installs them)"
        )
    return podman.build(*args)


# The digest of the installed service package's Python files (path and bytes), as run inside the image.
SOURCE_DIGEST = """
import hashlib, pathlib, service
root = pathlib.Path(service.__file__).parent
digest = hashlib.sha256()
for path in sorted(root.rglob("*.py")):
    digest.update(path.relative_to(root).as_posix().encode() + b"\\0" + path.read_bytes())
print(digest.hexdigest())
"""


def _service_digest() -> str:
    """SOURCE_DIGEST over this tree's service/."""
    root = REPO / "service"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def runtime_image() -> Iterator[str]:
    """The images built (the bases and tagged images stay, the next run's cache; `make clean-podman`
    removes everything); at the end, the dangling layers the builds left are pruned."""
    service_s = _build("service")
    print(f"\n--target service built in {service_s:.0f} s (bases included when they were missing)")
    image = _podman("image", "inspect", f"{TAG}:service", "--format", "{{json .Config}}")
    config = json.loads(image.stdout)
    assert config["User"] == "10001:10001"
    assert config["Cmd"] == ["python", "-m", "service"]
    health = json.loads(
        _podman("image", "inspect", f"{TAG}:service", "--format", "{{json .HealthCheck}}").stdout
    )
    assert health and "/usr/local/bin/healthcheck.py" in health["Test"], "the Docker format keeps HEALTHCHECK"
    no_torch = _podman(
        "run", "--rm", "--network", "none", f"{TAG}:service", "python", "-c", "import torch", check=False
    )
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr

    tiny_s = _build("runtime", "tiny")
    print(f"tiny runtime (models trained in the build) built in {tiny_s:.0f} s")
    # The layers come from a cache outside the clone (harness/cache.py): the image must hold this tree's
    # service, byte for byte, or a stale layer was reused.
    inside = _podman("run", "--rm", "--network", "none", f"{TAG}:tiny", "python", "-c", SOURCE_DIGEST)
    assert inside.stdout.strip() == _service_digest(), "the image's service package is not this tree's"
    yield f"{TAG}:tiny"
    podman.build("dangling")  # untagged layers of replaced builds, between builds (the script's lock)


@pytest.fixture
def container(runtime_image: str) -> Iterator[tuple[str, str, str]]:
    name, port, grpc_port = f"ts-image-test-{uuid.uuid4().hex[:8]}", free_port(), free_port()
    _podman(
        "run", "--detach", "--name", name, "--network", "host",
        "--env", "HOST=127.0.0.1", "--env", f"PORT={port}", "--env", f"GRPC_PORT={grpc_port}",
        "--env", "DEVICE=cpu", "--env", "SHUTDOWN_TIMEOUT_S=20",
        runtime_image,
    )  # fmt: skip
    try:
        yield name, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    finally:
        _podman("rm", "--force", "--time", "0", name, check=False)


def _wait_ready(name: str, url: str, timeout_s: float = 300) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        state = _podman("inspect", name, "--format", "{{.State.Status}}").stdout.strip()
        assert state == "running", (
            f"the container is {state}:\n{_podman('logs', name, check=False).stderr[-4000:]}"
        )
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"not ready in {timeout_s} s:\n{_podman('logs', name, check=False).stderr[-4000:]}")


def _png() -> bytes:
    image = Image.new("RGB", (32, 32), (200, 40, 40))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_the_runtime_image_serves_every_door_and_drains(container: tuple[str, str, str]) -> None:
    name, url, grpc_address = container
    ready_s = _wait_ready(name, url)
    print(f"\nthe tiny runtime container was ready in {ready_s:.1f} s")
    assert _podman("healthcheck", "run", name, check=False).returncode == 0, "the image's HEALTHCHECK"

    with httpx.Client(base_url=url, timeout=60, follow_redirects=True) as http:
        models = {m["name"] for m in http.get("/v1/models").json()["data"]}
        assert {
            "translator",
            "bert-classifier",
            "bert-qa",
            "bert-tagger",
            "bert-embedder",
            "gpt",
            "vit",
        } <= models
        calls = [
            ("POST", "/v1/translate", {"json": {"text": "A man is riding a bicycle."}}),
            ("POST", "/v1/classify", {"json": {"text": "a fine, warm film"}}),
            ("POST", "/v1/classify", {"json": {"image": base64.b64encode(_png()).decode()}}),
            ("POST", "/v1/classify/image", {"files": {"file": ("x.png", _png(), "image/png")}}),
            ("POST", "/v1/generate", {"json": {"prompt": "KING:", "max_new_tokens": 8}}),
            (
                "POST",
                "/v1/extract",
                {"json": {"task": "qa", "question": "Who rode?", "context": "A man rode a bike."}},
            ),
            ("POST", "/v1/extract", {"json": {"task": "entities", "text": "John lives in Berlin."}}),
            ("POST", "/v1/completions", {"json": {"model": "gpt", "prompt": "KING:", "max_tokens": 8}}),
            ("POST", "/v1/embeddings", {"json": {"model": "bert-embedder", "input": "a fine film"}}),
            ("POST", "/v2/models/gpt/generate", {"json": {"text_input": "KING:", "max_tokens": 8}}),
            (
                "POST",
                "/v2/models/bert-classifier/infer",
                {
                    "json": {
                        "inputs": [
                            {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a fine film"]}
                        ]
                    }
                },
            ),
            ("GET", "/v2/health/ready", {}),
            ("GET", "/metrics", {}),
            ("GET", "/", {}),
        ]
        for method, path, kwargs in calls:
            response = http.request(method, path, **kwargs)
            assert response.status_code == 200, (
                f"{method} {path}: {response.status_code} {response.text[:400]}"
            )
        with http.stream(
            "POST", "/v1/generate", json={"prompt": "KING:", "max_new_tokens": 8, "stream": True}
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert any("finish_reason" in e for e in events)

    grpc = tritonclient.grpc.InferenceServerClient(grpc_address)  # the fourth door: v2 over gRPC
    text = tritonclient.grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a fine film"], dtype=object))
    assert grpc.infer("bert-classifier", [text]).as_numpy("label").shape == (1,)
    grpc.close()

    stop = _podman("stop", "--time", "40", name, timeout=90)
    assert stop.returncode == 0
    exit_code = _podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
    logs = _podman("logs", name).stderr + _podman("logs", name).stdout
    assert exit_code == "0", f"exit {exit_code}:\n{logs[-3000:]}"
    assert "draining: readiness is 503" in logs


def test_the_stand_ins_for_the_compose_files_images_behave_as_the_file_uses_them() -> None:
    """redis, prometheus and haproxy as docker-compose.yml runs them (its commands, mounts and health
    checks), from the stand-ins `podman_build.sh standins` makes of Debian's packages under the file's
    image names: Redis answers a client from outside its container (protected mode off, as the official
    image has it), Prometheus is ready with the file's flags and the project's scrape config, HAProxy
    accepts the project's configuration for the compose network."""
    _build("standins")
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    redis, prometheus, lb = compose["redis"], compose["prometheus"], compose["lb"]
    name = f"ts-standin-{uuid.uuid4().hex[:8]}"

    port = free_port()
    _podman(
        "run",
        "-d",
        "--name",
        f"{name}-redis",
        "-p",
        f"127.0.0.1:{port}:6379",
        redis["image"],
        *redis["command"],
    )
    try:
        _wait_for(
            lambda: (
                _podman("exec", f"{name}-redis", *redis["healthcheck"]["test"][1:], check=False).returncode
                == 0
            )
        )
        assert (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            == "PONG"
        )
    finally:
        _podman("rm", "--force", "--time", "0", f"{name}-redis", check=False)

    config = REPO / "deploy" / "prometheus" / "prometheus.yml"
    _podman(
        "run",
        "-d",
        "--name",
        f"{name}-prometheus",
        "-v",
        f"{config}:/etc/prometheus/prometheus.yml:ro",
        prometheus["image"],
        *prometheus["command"],
    )
    try:
        check = prometheus["healthcheck"]["test"][1:]
        _wait_for(lambda: _podman("exec", f"{name}-prometheus", *check, check=False).returncode == 0)
    finally:
        _podman("rm", "--force", "--time", "0", f"{name}-prometheus", check=False)

    haproxy = REPO / "deploy" / "haproxy"
    valid = _podman(
        "run",
        "--rm",
        "-v",
        f"{haproxy}:/usr/local/etc/haproxy:ro",
        lb["image"],
        lb["command"][0],
        "-c",
        *lb["command"][1:],  # haproxy -c -f ...: check the configuration only
        check=False,
    )
    assert valid.returncode == 0 and "Configuration file is valid" in valid.stdout + valid.stderr, (
        valid.stderr
    )


def _wait_for(ready: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(1)
    pytest.fail(f"not healthy within {timeout_s} s")
