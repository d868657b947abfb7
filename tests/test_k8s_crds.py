"""The custom resources (KEDA's ScaledObject, KServe's ServingRuntime and InferenceServices) against their
own CRDs, and against the service they deploy.

The CRDs are the projects' own files, kept in tests/data/crds/ (README.md there: which release, which
path); the check is what the API server does with them, made strict: each resource, as
``kubectl kustomize`` renders it, must match the version's ``openAPIV3Schema`` with no field the schema
does not name (a typo such as ``minReplicas`` for ``minReplicaCount`` would otherwise be pruned
silently, and the autoscaler would run with its defaults). Then what the schemas cannot know: the
ScaledObject scales the api Deployment on metrics the service really exports, with PromQL that
``promtool`` parses; the KServe runtime's environment is valid service Settings once KServe fills in
``{{.Name}}``, its probes are routes the service serves, and each InferenceService names a model the
export builds. Last, a pod of one InferenceService, as a process: ``python -m service`` with the
runtime's environment serves that model alone, through the v2 protocol's routes.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_deployment import DOCKERFILE, K8S, _all, _kustomize, _service_stage, _stages

from harness.service_process import ServiceProcess
from model_export.profiles import MODEL_NAMES
from service.observe.metrics import Metrics
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "tests" / "data" / "crds"
KSERVE = REPO / "deploy" / "kserve"
NON_SETTINGS_ENV = {"ORT_DISABLE_TELEMETRY", "CUDA_CACHE_PATH"}


# ================================================================================================== schemas


def _crd_files() -> list[Path]:
    files = sorted(CRDS.glob("*.yaml"))
    if not files:
        pytest.skip(f"no CRDs in {CRDS}: see the README there for the files and where they come from")
    return files


@functools.cache
def _crd(path: Path) -> dict[str, Any]:
    """One CRD, parsed once (KServe's InferenceService CRD is 2 MB: libyaml's loader where present)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused where the API server would prune them.

    An object schema that lists ``properties`` and neither allows ``additionalProperties`` nor
    preserves unknown fields (``x-kubernetes-preserve-unknown-fields``) gets ``additionalProperties:
    false``; ``kubectl apply --validate=strict`` refuses the same fields.
    """
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _strict(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _strict(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [_strict(s) for s in out[key]]
    return out


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_schema(api_version, kind))


def _schema(api_version: str, kind: str) -> dict[str, Any]:
    group, _, version = api_version.rpartition("/")
    for path in _crd_files():
        crd = _crd(path)
        if crd["spec"]["group"] != group or crd["spec"]["names"]["kind"] != kind:
            continue
        for entry in crd["spec"]["versions"]:
            if entry["name"] == version:
                assert entry["served"], f"{api_version} {kind} is not served by {path.name}"
                return _strict(entry["schema"]["openAPIV3Schema"])
        pytest.fail(f"{path.name} has no version {version} of {kind}")
    pytest.skip(f"no CRD for {group} {kind} in {CRDS}: see the README there")


def _problems(resource: dict[str, Any]) -> list[str]:
    validator = _validator(resource["apiVersion"], resource["kind"])
    name = f"{resource['kind']}/{resource['metadata']['name']}"
    return [
        f"{name}: {'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(resource)
    ]


@pytest.fixture(scope="module")
def scaled_object() -> dict[str, Any]:
    (found,) = [r for r in _kustomize(K8S) if r["kind"] == "ScaledObject"]
    return found


@pytest.fixture(scope="module")
def kserve() -> list[dict[str, Any]]:
    return _kustomize(KSERVE)


def _runtime(kserve: list[dict[str, Any]]) -> dict[str, Any]:
    (runtime,) = [r for r in kserve if r["kind"] == "ServingRuntime"]
    return runtime


def _inference_services(kserve: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in kserve if r["kind"] == "InferenceService"}


def test_crds_are_the_projects_own_and_documented() -> None:
    readme = (CRDS / "README.md").read_text(encoding="utf-8")
    for path in _crd_files():
        crd = _crd(path)
        assert crd["kind"] == "CustomResourceDefinition"
        assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
        assert path.name in readme, f"{path.name}: say in {CRDS / 'README.md'} where it comes from"


def test_scaled_object_matches_kedas_crd(scaled_object: dict[str, Any]) -> None:
    assert _problems(scaled_object) == []


def test_kserve_resources_match_kserves_crds(kserve: list[dict[str, Any]]) -> None:
    problems = [p for resource in kserve for p in _problems(resource)]
    assert problems == []


def test_the_crd_check_catches_mistakes(scaled_object: dict[str, Any], kserve: list[dict[str, Any]]) -> None:
    typo = copy.deepcopy(scaled_object)
    typo["spec"]["minReplicas"] = typo["spec"].pop("minReplicaCount")  # the HPA's word, not KEDA's
    assert any("minReplicas" in p for p in _problems(typo))
    no_trigger = copy.deepcopy(scaled_object)
    del no_trigger["spec"]["triggers"]
    assert any("triggers" in p for p in _problems(no_trigger))

    isvc = copy.deepcopy(_inference_services(kserve)["gpt"])
    isvc["spec"]["predictor"]["scaleMetric"] = "queue"  # not one KServe knows
    assert any("scaleMetric" in p for p in _problems(isvc))
    runtime = copy.deepcopy(_runtime(kserve))
    runtime["spec"]["containers"][0]["readinesProbe"] = {}
    assert any("readinesProbe" in p for p in _problems(runtime))


# ==================================================================================================== KEDA


def _exported_metric_names() -> set[str]:
    metrics = Metrics.from_settings(Settings())
    return {family.name for family in metrics.registry.collect()}


def test_scaled_object_scales_the_api_on_the_queue(scaled_object: dict[str, Any]) -> None:
    from test_deployment import _by_kind_and_name

    manifests = _by_kind_and_name(_kustomize(K8S))
    deployment = manifests[("Deployment", "transformer-serving")]
    spec = scaled_object["spec"]
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        deployment["metadata"]["name"],
    )
    assert 2 <= spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]

    triggers = {t["name"]: t for t in spec["triggers"]}
    assert all(t["type"] == "prometheus" for t in triggers.values()), "scale on the queue, not CPU"
    assert "tserve_queue_depth" in triggers["queue-depth"]["metadata"]["query"]
    exported = _exported_metric_names()
    for trigger in triggers.values():
        # KEDA's fallback needs AverageValue: desired replicas = ceil(sum / threshold).
        assert trigger["metricType"] == "AverageValue"
        assert float(trigger["metadata"]["threshold"]) > 0
        used = set(re.findall(r"\b(tserve_[a-z_]+)\{", trigger["metadata"]["query"]))
        assert used and used <= exported, f"{trigger['name']}: {used - exported} is not exported"


def test_scaled_object_queries_are_promql(scaled_object: dict[str, Any], tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression (no Prometheus server needed)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make setup` (it installs Debian's prometheus package)"
    rules = [
        {"record": f"keda:{t['name'].replace('-', '_')}", "expr": t["metadata"]["query"]}
        for t in scaled_object["spec"]["triggers"]
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "bad", "rules": [{"record": "x", "expr": "sum(("}]}]})
    )
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True).returncode != 0


# =================================================================================================== KServe


def _fill_in(container: dict[str, Any], name: str) -> dict[str, Any]:
    """What KServe does to a runtime's container (ReplacePlaceholders): Go's template over its JSON,
    with the InferenceService's metadata; only ``{{.Name}}`` is used here."""
    text = json.dumps(container)
    assert set(re.findall(r"\{\{[^}]*\}\}", text)) <= {"{{.Name}}"}, "only {{.Name}} is filled in here"
    return json.loads(text.replace("{{.Name}}", name))


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_serving_runtime_runs_this_image_as_a_v2_server(kserve: list[dict[str, Any]]) -> None:
    runtime = _runtime(kserve)
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2"] and spec["multiModel"] is False
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container", "KServe's name for the serving container"
    env = _env(container)
    assert env["MODEL_REPOSITORY"] == "/mnt/models", "where KServe mounts storageUri"
    assert env["SERVED_MODELS"] == "{{.Name}}"
    assert env["WORKERS"] == "1"

    settings = Settings(
        **{k.lower(): v for k, v in _env(_fill_in(container, "gpt")).items() if k not in NON_SETTINGS_ENV}
    )
    assert settings.served_models == ["gpt"]
    (port,) = container["ports"]
    assert port["containerPort"] == settings.port and port["name"] in ("http1", "h2c")
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(settings.port)

    # Probes on the protocol's health routes, which the service serves (and answers 503 while draining).
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 120
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == settings.port

    security = container["securityContext"]
    _, stages, _ = _stages(DOCKERFILE.read_text(encoding="utf-8"))
    image_user = _all(_service_stage(stages), "USER")[-1].split(":")[0]
    assert str(security["runAsUser"]) == image_user and security["runAsNonRoot"] is True
    if security.get("readOnlyRootFilesystem"):
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}


def test_one_inference_service_per_model(kserve: list[dict[str, Any]]) -> None:
    runtime = _runtime(kserve)
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    (container,) = runtime["spec"]["containers"]
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][1])
    shutdown = float(_env(container)["SHUTDOWN_TIMEOUT_S"])
    services = _inference_services(kserve)
    assert sorted(services) == sorted(MODEL_NAMES), "one InferenceService per model the export builds"
    for name, isvc in services.items():
        predictor = isvc["spec"]["predictor"]
        model = predictor["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
        assert model["protocolVersion"] == "v2"
        assert model["storageUri"].startswith(("pvc://", "s3://", "gs://"))
        assert predictor["scaleMetric"] == "concurrency", f"{name}: scale on requests in flight, not CPU"
        assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
        assert predictor["terminationGracePeriodSeconds"] >= pre_stop + shutdown + 5, name


def test_a_pod_of_one_inference_service_serves_that_model_alone(
    kserve: list[dict[str, Any]], tiny_models: Path
) -> None:
    """``python -m service`` with the runtime's environment as KServe fills it in for the gpt
    InferenceService (the repository at a loopback path instead of /mnt/models)."""
    container = _fill_in(_runtime(kserve)["spec"]["containers"][0], "gpt")
    env = {**_env(container), "MODEL_REPOSITORY": str(tiny_models), "DEVICE": "cpu", "CUDA_CACHE_PATH": None}
    env.pop("HOST")
    env.pop("PORT")  # ServiceProcess binds a free loopback port
    with ServiceProcess(env, stop_grace_s=40) as service:
        assert service.get_status("/v2/health/ready") == 200
        assert service.get_status("/v2/health/live") == 200
        assert service.get_status("/v2/models/gpt/ready") == 200
        assert service.get_status("/v2/models/translator/ready") in (400, 404)
        assert [m["name"] for m in service.get_json("/v1/models")["data"]] == ["gpt"]
        assert service.get_json("/v2/models/gpt")["name"] == "gpt"
