"""The benchmarks run: every one in --quick mode against the tiny models, through run_all.py.

Smoke test only: the figures of a --quick run on tiny models mean nothing, so nothing here asserts a
timing or a ratio; only that each headline key is written as a positive number, that the results
table and the plot are written, and that every script fails clearly without a model repository.
The peer comparison (peers.py) needs LitServe and Ray Serve in a venv of their own, which the suite
does not make: here, only that it is skipped (or refused) clearly without one, and that the peer
servers' shared code answers exactly as the service's classifier does.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.peer_servers.classifier import FusedClassifier
from benchmarks.repository import find_model, model_folders
from service.engine.batcher import BatchPolicy
from service.engine.repository import load_model
from service.engine.runtime import RuntimeOptions
from service.pipelines.classify import TextClassifier, top_labels

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "kv_cache",
    "batching",
    "overhead",
    "continuous_batching",
    "response_cache",
    "cold_start",
    "protocols",
    "variants",
    "served_variants",
    "model_loads",
    "priority",
    "thrash",
    "peers",
    "generation_features",
    "run_all",
]
HEADLINE = [
    "kv_cache_speedup_256",
    "batching_speedup_32",
    "served_over_raw",
    "continuous_batching_speedup_16",
    "cache_hit_speedup_generate",
    "cold_start_seconds",
    "openai_over_native_generate",
    "oip_binary_over_native_classify",
    "int8_classify_speedup_32",
    "int8_served_classify_speedup_32",
    "reload_p99_over_steady_32",
    "priority_high_p99_overload_over_idle",
    "masked_step_speed",
    "prefix_cache_ttft_speedup",
    "ngram_speculation_speedup",
]


def test_run_all_quick_writes_every_headline_figure(tiny_models: Path, tmp_path: Path) -> None:
    out, results = tmp_path / "figures.json", tmp_path / "RESULTS.md"
    cmd = [
        sys.executable,
        "benchmarks/run_all.py",
        "--quick",
        "--models",
        str(tiny_models),
        "--json",
        str(out),
        "--results",
        str(results),
        "--out-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    figures = json.loads(out.read_text())
    for key in HEADLINE:
        value = figures.get(key)
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{key}: {value!r}"
        assert math.isfinite(value) and value > 0, f"{key}: {value!r}"
    assert not figures["failures"]
    table = results.read_text()
    assert "| figure | measured | target | verdict |" in table
    assert table.count("PASS") + table.count("MISS") >= len(HEADLINE)
    assert (tmp_path / "kv_cache_latency.png").stat().st_size > 1000


def _quick(
    script: str, tiny_models: Path, tmp_path: Path
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``benchmarks/<script>.py --quick --no-record`` on the tiny models: its figures and its run."""
    out = tmp_path / "figures.json"
    cmd = [sys.executable, f"benchmarks/{script}.py", "--quick", "--no-record", "--models", str(tiny_models)]
    proc = subprocess.run([*cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text()), proc


def test_model_loads_quick_times_every_model_and_loses_no_request(tiny_models: Path, tmp_path: Path) -> None:
    """model_loads.py alone: every model loaded over HTTP, the reloads under load answered with 200s only,
    each model's memory read, and the scan and the watcher measured at every repository size."""
    figures, proc = _quick("model_loads", tiny_models, tmp_path)
    value = figures["reload_p99_over_steady_32"]
    assert isinstance(value, float) and math.isfinite(value) and value > 0
    assert figures["errors_while_reloading"] == 0, figures["statuses_while_reloading"]
    assert figures["reloads"] >= 1 and figures["reloads_failed"] == 0
    assert figures["reloads_counted_by_server"] == figures["reloads"]
    names = {f.name for f in model_folders(tiny_models)}
    served = find_model(tiny_models, "text-classification").name
    assert figures["load_statuses"] == dict.fromkeys(names - {served}, 200)
    assert set(figures["load_ms"]) == names - {served} and set(figures["resident_mib"]) == names
    for key in ("scan_ms", "scan_cpu_ms", "watchfiles_detect_ms", "watchfiles_idle_cores"):
        assert set(figures[key]) == {"10", "100", "1000"}, key
        assert all(isinstance(v, float) and v >= 0 for v in figures[key].values()), (key, figures[key])
    assert "tiny test models" in proc.stdout
    assert "non-200 answers while reloading: 0.00 (target <= 0) PASS" in proc.stdout


def test_priority_quick_overloads_the_service_and_counts_every_answer(
    tiny_models: Path, tmp_path: Path
) -> None:
    """priority.py alone: capacity measured, an idle and an overload window, each class's answers counted,
    and none but 200, 429 and 504 (no timing asserted: a --quick run on tiny models means nothing)."""
    figures, proc = _quick("priority", tiny_models, tmp_path)
    value = figures["priority_high_p99_overload_over_idle"]
    assert isinstance(value, float) and math.isfinite(value) and value > 0
    assert figures["capacity_rps"] > 0 and figures["overload_rate_rps"] > figures["capacity_rps"]
    assert figures["other_answers"] == 0, (
        figures["overload_high_statuses"],
        figures["overload_low_statuses"],
    )
    for name in ("high", "low"):
        statuses = {int(s): n for s, n in figures[f"overload_{name}_statuses"].items()}
        sent = figures[f"overload_{name}_arrivals"] - figures[f"overload_{name}_not_sent"]
        assert sum(statuses.values()) == sent > 0, (name, statuses)
        assert set(statuses) <= {200, 429, 504}, (name, statuses)
    assert figures["overload_high_ok"] > 0
    assert "tiny test models" in proc.stdout
    assert "answers other than 200, 429 and 504: 0.00 (target <= 0) PASS" in proc.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_without_a_repository_says_so(script: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-models-here"
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}.py", "--models", str(missing), "--no-record"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"model repository {missing} does not exist" in proc.stderr


def test_peers_without_a_peers_python_are_skipped_or_refused(tiny_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    common = ["--models", str(tiny_models), "--no-record", "--quick"]
    run_all = [sys.executable, "benchmarks/run_all.py", "--only", "peers", "--json", str(out), *common]
    proc = subprocess.run(run_all, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "skipped: no --peers-python given" in proc.stdout
    assert "no --peers-python given" in json.loads(out.read_text())["skipped"]["peers"]
    alone = [sys.executable, "benchmarks/peers.py", *common, "--peers-python", str(tmp_path / "nothing")]
    proc = subprocess.run(alone, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"--peers-python {tmp_path / 'nothing'} does not exist" in proc.stderr


def test_peer_servers_classify_as_the_service_does(tiny_models: Path) -> None:
    """The peers' per-request work (benchmarks/peer_servers/classifier.py) is the service's, number for number."""
    folder = find_model(tiny_models, "text-classification")
    model = load_model(folder, RuntimeOptions(device="cpu", variant="fused"))
    assert model.variant.name == "fused"
    service = TextClassifier(model, BatchPolicy(32, 8192, 0.0, 256, 30.0))
    peer = FusedClassifier(folder)
    texts = ["a gorgeous, witty, seductive movie.", "it's slow -- very, very slow.", "dull " * 1000]
    ours, theirs = service.encode(texts), [peer.encode(t) for t in texts]
    assert [(e.ids, e.truncated) for e in theirs] == [(e.ids, e.truncated) for e in ours]
    assert theirs[-1].truncated and len(theirs[-1].ids) == service.max_len
    probs = peer.probabilities(theirs)  # (B, labels), one padded batch as the service's batcher runs it
    np.testing.assert_allclose(probs, np.stack(service.run_batch([e.ids for e in ours])), rtol=0, atol=1e-9)
    for encoded, p in zip(theirs, probs, strict=True):
        result = peer.answer(encoded, p)["results"][0]
        expected = top_labels(p, service.labels, 1, encoded.truncated)
        assert (result["label"], result["score"], result["truncated"]) == (
            expected.label,
            expected.score,
            expected.truncated,
        )


def test_request_path_quick_drives_every_door_and_each_answers_correctly(
    tiny_models: Path, tmp_path: Path
) -> None:
    """request_path.py for one second a door on the fake engine (wrk, h2load): every door's answer checked
    before its load, and no failed request under it. No timing is asserted."""
    figures, proc = _quick("request_path", tiny_models, tmp_path)
    doors = [
        "rest_classify_1",
        "rest_classify_8",
        "v2_infer_json",
        "v2_infer_binary",
        "openai_embeddings",
        "grpc_infer",
        "generate_stream",
    ]
    for door in doors:
        now = figures[door]["current"]
        assert now["requests"] > 0 and now["errors"] == 0, (door, now)
        assert now["server_cpu_us"] > 0 and 0 <= now["client_cpu_share"] < 1.5, (door, now)
    assert figures["generate_stream"]["server_cpu_us_per_token"] > 0
    assert figures["errors"] == {}
    assert "REST classify, 1 text" in proc.stdout
