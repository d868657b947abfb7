"""The load-test harness (loadtests/): its input loaders, and a short real run of loadtests/run.

The locustfile itself is never imported here: importing locust monkey-patches the standard library
with gevent, which must not happen inside the test process. It runs in subprocesses instead.
"""

from __future__ import annotations

import base64
import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
LOADTESTS = ROOT / "loadtests"

# Every request name the locustfile reports, and the two streaming measurements.
ENDPOINTS = (
    "/v1/translate",
    "/v1/classify [text]",
    "/v1/classify [image]",
    "/v1/classify/image",
    "/v1/generate",
    "/v1/generate [stream]",
    "/v1/extract [qa]",
    "/v1/extract [entities]",
)
STREAM_METRICS = ("generate-stream ttft", "generate-stream ms/token")
USER_NAMES = (
    "translate",
    "classify_text",
    "classify_image",
    "generate",
    "generate_stream",
    "extract_qa",
    "extract_entities",
)

needs_locust = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None,
    reason="locust is not installed (the `load` extra: pip install -e '.[load]')",
)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"loadtests_{name}", LOADTESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def loaders() -> ModuleType:
    return _load("loadtest_data")


def test_loaders_read_the_validation_splits(loaders: ModuleType, data_dir: Path) -> None:
    inputs = loaders.load_inputs(data_dir)
    # Sizes from the data README (validation splits only).
    assert len(inputs.translate) == 1014
    assert len(inputs.sentiment) == 872
    assert len(inputs.qa) == 1386
    assert len(inputs.images) == 5000 and {len(i.pixels) for i in inputs.images} == {28 * 28}
    assert 2000 < len(inputs.entities) < 3250  # sentences of 4+ tokens out of 3,250
    assert len(inputs.prompts) > 100
    assert all(not s.endswith(" ") and "\t" not in s for s in inputs.sentiment)
    assert all(q.strip() and len(c) > len(q) for q, c in inputs.qa)
    assert all(
        p.split("\n", 1)[0].endswith(":") and len(p) <= loaders.MAX_PROMPT_CHARS for p in inputs.prompts
    )
    assert "-DOCSTART-" not in " ".join(inputs.entities)
    assert "West Indian all-rounder Phil Simmons" in inputs.entities[1]
    assert all(Path(source).is_file() for source in inputs.sources.values())
    for item in (inputs.images[0], loaders.fallback_images()[0]):  # the PNG encoder, checked by Pillow
        image = Image.open(io.BytesIO(base64.b64decode(loaders.png_base64(item))))
        assert (image.format, image.size, image.mode) == ("PNG", (28, 28), "L")
        assert image.tobytes() == item.pixels


def test_loaders_fall_back_to_built_in_samples(
    loaders: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))  # exists, but holds no dataset
    inputs = loaders.load_inputs()
    assert inputs.data_dir == tmp_path
    assert set(inputs.sources.values()) == {"built-in"}
    assert all(n > 0 for n in inputs.counts().values())
    assert all(len(i.pixels) == 28 * 28 for i in inputs.images)

    monkeypatch.setenv("DATA_DIR", str(tmp_path / "missing"))  # named but absent: no other directory
    assert loaders.load_inputs().data_dir is None


def test_warm_pool_is_small_and_fixed(loaders: ModuleType, data_dir: Path) -> None:
    inputs = loaders.load_inputs(data_dir)
    a, b = inputs.pool(8), inputs.pool(8)
    assert a.counts() == dict.fromkeys(a.counts(), 8)
    assert a.translate == b.translate and a.qa == b.qa and a.images == b.images


def test_fit_prompt(loaders: ModuleType) -> None:
    prompt = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east.\n"
    assert loaders.fit_prompt(prompt, 200) == prompt
    assert loaders.fit_prompt(prompt, 70) == "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    assert loaders.fit_prompt(prompt, 30) == "ROMEO:\nBut soft, what light"


@needs_locust
def test_locustfile_user_classes_and_weights() -> None:
    def listing(weights: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LOCUST_WEIGHTS": weights}
        cmd = [sys.executable, "-m", "locust", "-f", str(LOADTESTS / "locustfile.py"), "--list"]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    everything = listing("")
    assert everything.returncode == 0, everything.stderr[-2000:]
    classes = [line.strip() for line in everything.stdout.splitlines() if line.strip().endswith("User")]
    assert len(classes) == len(USER_NAMES)
    without_stream = listing("generate_stream=0,translate=5")
    assert without_stream.returncode == 0, without_stream.stderr[-2000:]
    assert "GenerateStreamUser" not in without_stream.stdout and "TranslateUser" in without_stream.stdout
    wrong = listing("translation=2")
    assert wrong.returncode != 0 and "LOCUST_WEIGHTS" in wrong.stderr


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@needs_locust
@pytest.mark.slow
def test_run_against_the_tiny_models(tiny_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "loadtest"
    weights = ",".join(f"{name}=1" for name in USER_NAMES)  # equal weights: one user per class
    cmd = [
        str(LOADTESTS / "run"),
        "--models", str(tiny_models),
        "--duration", "10s",
        "--users", str(len(USER_NAMES)),
        "--weights", weights,
        "--max-new-tokens", "16",
        "--out", str(out),
        "--ready-timeout", "300",
        "--quiet",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "LOCUST_WEIGHTS", "LOAD_MIX")}
    env["PYTHON"] = sys.executable
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    report = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report

    for name in (
        "locust_stats.csv",
        "locust_stats_history.csv",
        "locust_failures.csv",
        "report.html",
        "summary.md",
        "run.json",
        "load_stats.json",
        "service.log",
    ):
        assert (out / name).is_file(), f"{name} missing\n{report}"
    for png in ("latency_percentiles.png", "latency_over_time.png", "throughput_over_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png

    with (out / "locust_stats.csv").open(newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    for name in (*ENDPOINTS, *STREAM_METRICS):
        assert name in rows, f"{name} got no requests\n{report}"
        assert int(rows[name]["Request Count"]) > 0, name
        assert int(rows[name]["Failure Count"]) == 0, (
            f"{name} failed\n{(out / 'locust_failures.csv').read_text()}"
        )
    with (out / "locust_failures.csv").open(newline="") as f:
        assert list(csv.DictReader(f)) == []

    summary = (out / "summary.md").read_text()
    assert "| POST /v1/translate |" in summary and "time to first token" in summary
    assert "Failures\n\nNone." in summary

    run = json.loads((out / "run.json").read_text())
    assert run["exit_code"] == 0 and run["cache"].startswith("Redis")
    assert {m["name"] for m in run["models"]} >= {"translator", "gpt", "vit", "bert-qa"}
    load = json.loads((out / "load_stats.json").read_text())
    assert load["mix"] == "cold" and set(load["weights"]) == set(USER_NAMES)
    # Everything the run started is gone: the service and its private redis-server.
    for what, pid in run["pids"].items():
        assert pid and not _alive(pid), f"{what} (pid {pid}) still running"
