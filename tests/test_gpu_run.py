"""The GPU run on CPU: its carry packed, staged call by call, joined and installed; its checks wired.

A lent GPU machine has no registry and takes at most 64 MiB a call, so ``scripts/gpu/pack.py`` splits
what it lacks into parts that separate calls carry, and ``scripts/gpu/device_run.py`` joins them there.
Here the same two scripts run on a small payload (a real wheel made on the spot, a model folder, data)
split into many small parts, each staged as if by its own call: so that nothing but the GPU is left
untested when one is lent.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

from service.engine.manifest import content_version

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / "scripts" / "gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(folder: Path) -> Path:
    """A real, minimal wheel (package ``gpu_probe``, one function), RECORD hashes included."""
    files = {
        "gpu_probe/__init__.py": b"def answer():\n    return 42\n",
        "gpu_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: gpu-probe\nVersion: 1.0\n",
        "gpu_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("gpu_probe-1.0.dist-info/RECORD,,")
    path = folder / "gpu_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("gpu_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _model(folder: Path) -> None:
    """A model folder as the export leaves it: reference, fused, fp16 and int8 graphs, attention maps."""
    folder.mkdir(parents=True)
    graphs = {
        "reference": "model.onnx",
        "fused": "model.fused.onnx",
        "fp16": "model.fp16.onnx",
        "int8": "model.int8.onnx",
        "attention": "attention.onnx",
    }
    files = {}
    for name in ("tokenizer.json", *graphs.values()):
        data = os.urandom(2500)
        (folder / name).write_bytes(data)
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest = {
        "graphs": {"model": {"file": "model.onnx", "inputs": [], "outputs": []}},
        "variants": {
            v: {"graphs": {"model": graphs[v]}, "reason": f"{v} record"} for v in ("fused", "fp16", "int8")
        },
        "attention_maps": {"file": "attention.onnx"},
        "files": files,
        "version": "old",
    }
    manifest["variants"]["int8"]["inplace_decode"] = {"model": "model.int8.onnx"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "training_curve.png").write_bytes(b"not listed, not sent")


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A core payload (a wheel, tiny models, data, a whole model) and an extra one, in 2 KiB parts."""
    pack = _script("pack")
    tiny = tmp_path / "tiny"
    (tiny / "gpt").mkdir(parents=True)
    (tiny / "gpt" / "model.onnx").write_bytes(os.urandom(3000))
    (tiny / ".work").mkdir()
    (tiny / ".work" / "checkpoint.pt").write_bytes(b"left behind")
    _model(tmp_path / "models" / "bert")
    _model(tmp_path / "models" / "qa")
    data = tmp_path / "data"
    for dataset, files in {
        "sst2": ("train.tsv", "validation.tsv"),
        "mnist": ("validation-images.gz",),
    }.items():
        (data / dataset).mkdir(parents=True)
        for file in files:
            (data / dataset / file).write_text(f"{dataset} {file}\n")
    core = pack.build_payload(
        [_wheel(tmp_path)], tiny, {"bert": (tmp_path / "models" / "bert", "fused")}, data
    )
    extra = pack.build_payload([], None, {"qa": (tmp_path / "models" / "qa", "fp16")}, None)
    out = tmp_path / "carry"
    parts = pack.split({"core": core, "extra": extra}, 2048, out)
    return out, {"parts": parts, "payloads": {"core": core, "extra": extra}}


def _device(action: str, carry: Path, stage: Path, work: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_CARRY": str(carry), "GPU_STAGE": str(stage), "GPU_WORK": str(work)}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu" / "device_run.py"), action],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _call(out: Path, index: int, tmp_path: Path) -> Path:
    """What one device call sees: its own carried folder, alone."""
    call = tmp_path / f"call-{index}"
    call.mkdir()
    (call / f"carry-{index}").symlink_to(out / f"carry-{index}", target_is_directory=True)
    return call


def test_parts_fit_and_list_each_other(packed: tuple[Path, dict[str, object]]) -> None:
    out, info = packed
    parts, payloads = info["parts"], info["payloads"]
    assert isinstance(parts, list) and isinstance(payloads, dict) and len(parts) > 3
    calls = max(p["folder"] for p in parts)
    folders = sorted(out.iterdir(), key=lambda f: int(f.name.split("-")[1]))
    assert [f.name for f in folders] == [f"carry-{i}" for i in range(1, calls + 1)]
    for index, folder in enumerate(folders, 1):
        held = [p for p in parts if p["folder"] == index]
        sent = sorted(f.name for f in folder.iterdir() if f.name != "parts.json")
        assert sent == sorted(p["name"] for p in held)
        assert sum((folder / p["name"]).stat().st_size for p in held) == sum(p["bytes"] for p in held) <= 2048
        listing = json.loads((folder / "parts.json").read_text())  # every call can tell what the run lacks
        assert [p["name"] for p in listing["payloads"]["core"]["parts"]] == [
            p["name"] for p in parts if p["name"].startswith("core-")
        ]
    # A payload's last part and the next one's first share a call where they fit: no call is half empty.
    assert all(sum(p["bytes"] for p in parts if p["folder"] == k) == 2048 for k in range(1, calls))
    core_last = [p for p in parts if p["name"].startswith("core-")][-1]
    assert core_last["bytes"] == 2048 or core_last["folder"] == parts[parts.index(core_last) + 1]["folder"]
    for name, payload in payloads.items():
        joined = b"".join(
            (out / f"carry-{p['folder']}" / p["name"]).read_bytes()
            for p in parts
            if p["name"].startswith(name + "-")
        )
        assert joined == payload


def test_staged_call_by_call_then_joined_and_installed(
    packed: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    out, info = packed
    parts = info["parts"]
    assert isinstance(parts, list)
    stage, work = tmp_path / "stage", tmp_path / "work"
    calls = max(p["folder"] for p in parts)
    for index in range(1, calls):  # every call but the last only stages its part
        staged = _device("stage", _call(out, index, tmp_path), stage, work)
        assert staged.returncode == 0, staged.stderr
    early = _device("unpack", tmp_path / "nothing", stage, work)  # the last (extra) part not carried yet
    assert early.returncode == 0, early.stderr  # the optional payload is left out, saying which part
    unsent = [p["name"] for p in parts if p["folder"] == calls]
    assert all(name.startswith("extra-") for name in unsent)
    assert f"payload extra left out: parts not staged {unsent}" in early.stdout
    assert not (work / "models" / "qa").exists()
    last = _device("unpack", _call(out, calls, tmp_path), stage, work)
    assert last.returncode == 0, last.stderr
    assert sorted(p.name for p in work.iterdir()) == ["data", "models", "site", "tiny-models", "wheels"]
    assert "unpacked ['core', 'extra']" in last.stdout
    assert (work / "tiny-models" / "gpt" / "model.onnx").is_file()
    assert not (work / "tiny-models" / ".work").exists()  # checkpoints stay behind
    # Sent: what CUDA serves (fused fp32 standing as the reference, fp16 beside it), listed exactly.
    bert = json.loads((work / "models" / "bert" / "manifest.json").read_text())
    sent = sorted(p.name for p in (work / "models" / "bert").iterdir())
    assert sent == ["manifest.json", "model.fp16.onnx", "model.fused.onnx", "tokenizer.json"]
    assert sorted(bert["files"]) == sent[1:] and bert["graphs"]["model"]["file"] == "model.fused.onnx"
    assert list(bert["variants"]) == ["fp16"] and "attention_maps" not in bert
    assert bert["version"] == content_version(bert["files"]) != "old"
    assert bert["carried"] == {"reference": "fused", "from_version": "old"}
    qa = json.loads((work / "models" / "qa" / "manifest.json").read_text())  # fp16 alone, for its check
    assert sorted(qa["files"]) == ["model.fp16.onnx", "tokenizer.json"] and qa["variants"] == {}
    assert (
        qa["graphs"]["model"]["file"] == "model.fp16.onnx"
        and qa["carried"]["fp16_record"]["reason"] == "fp16 record"
    )
    assert (work / "data" / "sst2" / "train.tsv").is_file() and (
        work / "data" / "mnist" / "validation-images.gz"
    ).is_file()
    imported = subprocess.run(
        [sys.executable, "-c", "import gpu_probe; print(gpu_probe.answer(), gpu_probe.__file__)"],
        env={**os.environ, "PYTHONPATH": str(work / "site")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    answer, where = imported.stdout.split()
    assert answer == "42" and Path(where).is_relative_to(work / "site")


def test_a_damaged_part_is_refused(packed: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    out, info = packed
    parts = info["parts"]
    assert isinstance(parts, list)
    stage, work = tmp_path / "stage", tmp_path / "work"
    damaged = out / "carry-2" / "core-02"
    data = bytearray(damaged.read_bytes())
    data[10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = _device("unpack", out, stage, work)  # all folders at once: the tool's limit aside, the same
    assert result.returncode != 0 and "core-02 is damaged" in result.stderr


def test_the_core_payload_must_be_whole(packed: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    out, _ = packed
    result = _device("unpack", _call(out, 1, tmp_path), tmp_path / "stage", tmp_path / "work")
    assert result.returncode != 0 and "parts not staged yet: ['core-02'" in result.stderr


def test_the_lock_gives_every_service_wheel_but_numpy() -> None:
    pins = _script("pack").locked_requirements(ROOT / "requirements.lock")
    names = {p.split("==")[0].lower() for p in pins}
    assert {"onnxruntime-gpu", "litestar", "uvicorn", "tokenizers", "grpcio", "redis"} <= names
    assert "numpy" not in names and "onnxruntime" not in names  # the machine's numpy; the GPU build only
    assert all("==" in p and ";" not in p for p in pins)


# --- the run's checks, on CPU: what the GPU machine will run, wired the same way ---------------------


def test_fp16_alone_is_validated_and_recorded_by_the_rule(
    tiny_models: Path, tmp_path: Path, data_dir: Path
) -> None:
    """A model carried with its fp16 graphs alone (the extra payload) gets its validation pass and rule."""
    from model_export.variants import BATCH_TOLERANCE, RULES, validate_on_cuda

    pack = _script("pack")
    manifest, files = pack.carried_model(tiny_models / "bert-classifier", "fp16")
    folder = tmp_path / "models" / "bert-classifier"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for name, path in files.items():
        (folder / name).write_bytes(path.read_bytes())
    record = validate_on_cuda(tmp_path / "models", "bert-classifier", data_dir, limit=24, device="cpu")
    saved = json.loads((folder / "manifest.json").read_text())["carried"]["fp16_record"]
    assert saved == json.loads(json.dumps(record))  # written back where it came from
    metric, tolerance, _ = RULES["text-classification"]
    reference = manifest["validation"]["validation"][metric]
    assert record["validation"]["examples"] == 24
    assert record["delta"][metric] == pytest.approx(record["validation"][metric] - reference, abs=1e-3)
    passes = -record["delta"][metric] <= tolerance + 1e-9 and record["batch_max_abs_diff"] <= BATCH_TOLERANCE
    assert record["serve_by_default"] == passes
    assert record["validated_on"]["provider"] == "CPUExecutionProvider"
    # The graphs evaluated were the fp16 ones (float16 weights inside), not a fallback to fp32.
    graph = onnx.load(str(folder / manifest["graphs"]["model"]["file"]))
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in graph.graph.initializer)


def test_fp16_inplace_step_decodes_the_concat_tokens(tiny_models: Path, tmp_path: Path) -> None:
    """GPT's fp16 in-place step graph (GroupQueryAttention over float16 buffers bound as past and present)
    gives the fp16 Concat decoder's logits and tokens (here on ONNX Runtime's CPU provider)."""
    out = tmp_path / "inplace.json"
    script = ["scripts/gpu/inplace_fp16.py", "--model", str(tiny_models / "gpt"), "--device", "cpu"]
    proc = subprocess.run(
        [sys.executable, *script, "--new-tokens", "12", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(out.read_text())
    ways = found["ways"]
    assert found["same_tokens"]
    assert "GroupQueryAttention" in found["step_graph_ops"] and "Concat" not in found["step_graph_ops"]
    assert ways["fp32_concat"]["max_abs_diff_vs_fp32_recompute"] <= 1e-4  # the cache itself is right
    # float16 rounding, the same in place as with Concat: a wrong cache column would be far off
    fp16 = ways["fp16_concat"]["max_abs_diff_vs_fp32_recompute"]
    assert 0 < fp16 < 0.05
    assert ways["fp16_inplace"]["max_abs_diff_vs_fp32_recompute"] <= 2 * fp16 + 1e-3
    assert ways["fp16_inplace"]["argmax_is_forced"] == ways["fp16_concat"]["argmax_is_forced"]


# --- the fp16 validation recorded on a GPU machine, and what a CPU build makes of it ---------------


def _record(tmp_path: Path, **entry: object) -> Path:
    base = {
        "profile": "default",
        "steps": 700,
        "version": "v1",
        "metric": "bits_per_char",
        "reference": 2.6445,
        "fp16": 2.6444,
        "delta": -0.0001,
        "tolerance": 0.05,
        "passes": True,
        "batch_max_abs_diff": 0.0,
        "cpu_parity_max_abs_diff": 0.004,
    }
    record = {"device": "NVIDIA H200", "onnxruntime": "1.31.1", "date": "2026-11-27", "git": "abc1234"}
    path = tmp_path / "fp16_validation.json"
    path.write_text(json.dumps({**record, "models": {"gpt": {**base, **entry}}}))
    return path


def _gpt_manifest(version: str = "v2", profile: str = "default", steps: int = 700) -> dict[str, object]:
    return {"name": "gpt", "version": version, "training": {"profile": profile, "steps": steps}}


@pytest.mark.parametrize(
    ("record", "manifest", "cpu_parity", "served", "words"),
    [
        ({}, {"version": "v1"}, 0.004, True, "for these very graphs"),
        ({}, {}, 0.006, True, "near the validated build's 0.004"),  # another build, as near its reference
        ({}, {}, 0.02, False, "not near the validated build's 0.004"),  # its fp16 strays further
        ({"passes": False}, {"version": "v1"}, 0.004, False, "beyond the allowed change"),
        ({}, {"steps": 1400}, 0.004, None, ""),  # another recipe (--steps): the record says nothing
        ({}, {"profile": "tiny"}, 0.004, None, ""),
    ],
)
def test_a_cpu_build_judges_fp16_by_the_recorded_gpu_validation(
    tmp_path: Path,
    record: dict[str, object],
    manifest: dict[str, object],
    cpu_parity: float,
    served: bool | None,
    words: str,
) -> None:
    from model_export.variants import _recorded_rule, recorded_fp16

    built = _gpt_manifest(**manifest)  # type: ignore[arg-type]
    recorded = recorded_fp16(built, _record(tmp_path, **record))
    if served is None:
        assert recorded is None
        return
    assert recorded is not None and recorded["device"] == "NVIDIA H200" and recorded["git"] == "abc1234"
    judged = _recorded_rule(recorded, cpu_parity, str(built["version"]))
    assert judged["serve_by_default"] is served and words in judged["reason"]
    assert judged["reason"].startswith(
        "validated on NVIDIA H200 with ONNX Runtime 1.31.1 (2026-11-27, commit abc1234)"
    )


def test_the_committed_record_is_the_rule_applied_to_the_default_recipes() -> None:
    """Each entry's verdict is the rule on its own figures, for the default profile's current recipe.

    A recipe whose steps changed no longer matches its entry (a build of it is another model): the
    entry must then go, or be measured again on a GPU (docs/DEVELOPMENT.md, "The GPU run").
    """
    from model_export.profiles import recipe_for
    from model_export.variants import BATCH_TOLERANCE, FP16_RECORD, RULES

    record = json.loads(FP16_RECORD.read_text())
    assert record["models"], "no model recorded"
    for name, entry in record["models"].items():
        assert entry["profile"] == "default" and entry["steps"] == recipe_for("default", name).train.steps, (
            name
        )
        task = next(
            t for t, rule in RULES.items() if rule[0] == entry["metric"] and rule[1] == entry["tolerance"]
        )
        _, tolerance, higher = RULES[task]
        assert entry["delta"] == pytest.approx(entry["fp16"] - entry["reference"], abs=1e-3), name
        drop = -entry["delta"] if higher else entry["delta"]
        assert entry["passes"] == (
            drop <= tolerance + 1e-9 and entry["batch_max_abs_diff"] <= BATCH_TOLERANCE
        ), name


def test_a_recorded_validation_is_applied_to_a_built_folder(tiny_models: Path, tmp_path: Path) -> None:
    """``apply_recorded_fp16`` (record_fp16.py) rewrites the fp16 record so the service serves it on CUDA."""
    from model_export.variants import apply_recorded_fp16
    from service.engine.manifest import Manifest
    from service.engine.variants import choose_variant

    folder = tmp_path / "gpt"
    shutil.copytree(tiny_models / "gpt", folder, ignore=shutil.ignore_patterns(".work"))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert choose_variant(Manifest.model_validate(manifest), "cuda").name != "fp16"  # not validated yet
    steps, profile = manifest["training"]["steps"], manifest["training"]["profile"]
    parity = manifest["variants"]["fp16"]["parity_max_abs_diff"]
    path = _record(
        tmp_path, version=manifest["version"], steps=steps, profile=profile, cpu_parity_max_abs_diff=parity
    )
    judged = apply_recorded_fp16(folder, path)
    assert judged is not None and judged["serve_by_default"]
    saved = Manifest.model_validate(json.loads((folder / "manifest.json").read_text()))
    assert choose_variant(saved, "cuda").name == "fp16" and choose_variant(saved, "cpu").name != "fp16"


def test_a_step_past_its_limit_takes_its_children_with_it(tmp_path: Path) -> None:
    """A benchmark's servers must not outlive the step that started them (they held the port and a core)."""
    import time as clock

    device_run = _script("device_run")
    device_run.WORK = tmp_path / "work"
    steps = device_run.Steps(tmp_path, dict(os.environ), deadline=clock.monotonic() + 2)
    pid_file = tmp_path / "child.pid"
    spawn = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    assert steps.run("providers", [sys.executable, "-c", spawn]) == 124
    child = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        clock.sleep(0.1)
    else:
        pytest.fail(f"the step's child {child} outlived it")
    assert json.loads((tmp_path / "summary.json").read_text())["steps"]["providers"]["exit"] == 124


def test_node_placement_is_read_from_onnx_runtime_s_verbose_log() -> None:
    """Both ways ONNX Runtime may print a partial placement: node lines behind the log's prefix, or bare."""
    placement = _script("placement")
    prefix = "2026-11-27 02:55:08.123 [V:onnxruntime:, session_state.cc:1169 VerifyEachNodeIsAssignedToAnEp]"
    log = "\n".join(
        [
            "=== /m/model.fp16.onnx",
            f"{prefix} Node placements",
            f"{prefix}  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 159",
            f"{prefix}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 3",
            f"{prefix}   Shape (/bert/Shape)",
            f"{prefix}   Gather (/bert/Gather_1)",
            "  Shape (/bert/Shape_2)",
            f"{prefix} Something else entirely (not a node)",
            "=== /m/vit.onnx",
            f"{prefix}  All nodes placed on [CUDAExecutionProvider]. Number of nodes: 54",
        ]
    )
    found = placement.parse(log)
    fp16 = found["/m/model.fp16.onnx"]
    assert fp16["nodes"] == {"CUDAExecutionProvider": 159, "CPUExecutionProvider": 3}
    assert fp16["cpu_ops"] == {"Shape": 2, "Gather": 1}
    assert fp16["cpu_raw"][0] == "Shape (/bert/Shape)"
    assert found["/m/vit.onnx"] == {"nodes": {"CUDAExecutionProvider": 54}, "cpu_ops": {}, "cpu_raw": []}


# --- the engine on the device: what the GPU run adds, wired and checked here -------------------------


def test_gpt_is_carried_with_its_fp16_step_graph_which_decodes_on_device_buffers(
    tiny_models: Path, tmp_path: Path
) -> None:
    """pack.py adds GPT's in-place step graph in float16 to the carried folder (listed, hashed, its step
    difference recorded); the service loads the folder as it is, and the step decodes over device buffers
    (here ONNX Runtime's CPU provider, whose GroupQueryAttention takes float16 too) near the fp16 Concat
    decoder."""
    import io
    import tarfile

    from test_device_kv import _decode_with_joins_and_leaves

    from service.engine.decoder_graph import DecoderGraph
    from service.engine.repository import load_model
    from service.engine.runtime import Graph, RuntimeOptions

    pack = _script("pack")
    payload = pack.build_payload([], None, {"gpt": (tiny_models / "gpt", "fused")}, None)
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "models" / "gpt"
    manifest = json.loads((folder / "manifest.json").read_text())
    fp16 = manifest["variants"]["fp16"]
    step = fp16["inplace_decode"]["model"]
    assert step == "model.fp16.inplace.onnx" and (folder / step).is_file()
    assert manifest["files"][step]["sha256"] == hashlib.sha256((folder / step).read_bytes()).hexdigest()
    assert manifest["version"] == content_version(manifest["files"])
    assert 0 < fp16["inplace_max_abs_diff"] < 0.05  # float16 rounding, not a wrong column
    ops = {n.op_type for n in onnx.load(str(folder / step)).graph.node}
    assert "GroupQueryAttention" in ops and "Concat" not in ops
    model = load_model(folder, RuntimeOptions(device="cpu", variant="fp16"))  # hashes and files check out
    half = Graph(folder / fp16["graphs"]["model"], RuntimeOptions(device="cpu"))
    concat = DecoderGraph(half, model.manifest)
    on_device = DecoderGraph(
        half, model.manifest, Graph(folder / step, RuntimeOptions(device="cpu")), device_buffers=True
    )
    assert on_device.device_step is not None and on_device.device_step.dtype == np.float16
    want = _decode_with_joins_and_leaves(concat, model)
    got = _decode_with_joins_and_leaves(on_device, model)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert float(np.abs(a - b).max()) < 0.05, f"step {i}"


def _deb(folder: Path) -> Path:
    """A real, minimal .deb (dpkg-deb --build) holding usr/bin/wrk, a script that prints wrk's result line."""
    root = folder / "fakewrk"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: wrk\nVersion: 4.1.0-0\nArchitecture: all\nMaintainer: test <t@example.org>\nDescription: test\n"
    )
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "wrk").write_text("#!/bin/sh\necho wrk 4.1.0\n")
    (root / "usr" / "bin" / "wrk").chmod(0o755)
    deb = folder / "wrk_4.1.0-0_all.deb"
    subprocess.run(
        ["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True, capture_output=True
    )
    return deb


def test_two_calls_share_one_install_and_each_runs_its_phase(tmp_path: Path) -> None:
    """The engine call joins, installs (the service's wheels, PyTriton's apart) and unpacks wrk's .deb; the
    table call on the same machine finds them installed and runs its phase only; both bring back their logs."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    pack = _script("pack")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    core = pack.build_payload([_wheel(wheels)], None, {}, None, [_deb(tmp_path)])
    triton = pack.build_payload([_wheel(wheels)], None, {}, None, wheel_folder="triton-wheels")
    out = tmp_path / "carry"
    pack.split({"core": core, "triton": triton}, 1 << 20, out)
    stage, work, results = tmp_path / "stage", tmp_path / "work", tmp_path / "out"
    env = {
        **os.environ,
        "GPU_CARRY": str(out),
        "GPU_STAGE": str(stage),
        "GPU_WORK": str(work),
        "OUT": str(results),
    }
    script = [sys.executable, str(ROOT / "scripts" / "gpu" / "device_run.py"), "run", "--dry-run"]
    summaries = []
    for phase, skipped in (("engine", ["pytest", "inplace", "bench_engine"]), ("table", ["bench_table"])):
        proc = subprocess.run(
            [*script, "--phase", phase, "--skip", *skipped, "--seconds", "120"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        summaries.append(json.loads((results / "summary.json").read_text()))
    first, second = summaries
    steps = {"install", "triton_venv", "install_triton", "providers"}
    assert first["phase"] == "engine" and set(first["steps"]) == steps, first["steps"]
    assert second["phase"] == "table" and second["steps"] == {}  # installed already; its one step skipped
    assert first["wrk"] == second["wrk"] == str(work / "wrk-root" / "usr" / "bin" / "wrk")
    assert subprocess.run([first["wrk"]], capture_output=True, text=True).stdout.strip() == "wrk 4.1.0"
    venv = (
        work / "triton-venv" / "bin" / "python"
    )  # PyTriton's own venv, the service's packages after its own
    found = subprocess.run(
        [str(venv), "-c", "import gpu_probe, onnxruntime; print(gpu_probe.__file__)"],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found.stderr
    assert "triton-venv" in found.stdout
    with tarfile.open(results / "logs.tar.gz") as tar:  # the second call's logs hold the first's too
        assert {"logs/install.log", "logs/providers.log"} <= set(tar.getnames())


def test_the_gpu_plan_has_each_figure_the_issue_asks_for() -> None:
    """Phase ``engine`` the in-process A/B; phase ``table`` every ratio of the GPU table, each key once."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu

    keys = {phase: [key for key, _, _ in plan] for phase, plan in gpu.PLAN.items()}
    assert keys["engine"] == ["gpu_engine"]
    wanted = ["kv_cache", "continuous_batching", "continuous_batching_cuda_graphs", "batching", "overhead"]
    assert keys["table"][:7] == [*wanted, "wrk_sweep", "triton_gpu"]
    assert keys["all"] == keys["engine"] + keys["table"] and len(set(keys["all"])) == len(keys["all"])
    plan = dict((key, extra) for key, _, extra in gpu.PLAN["table"])
    assert plan["continuous_batching"]["streams"] == [1, 16, 64]
    assert plan["continuous_batching_cuda_graphs"]["server_env"] == {"CUDA_GRAPHS": "true"}
    assert plan["wrk_sweep"]["connections"] == plan["triton_gpu"]["connections"] == [32, 64, 256]
