"""The GPU run, on the lent machine: stage the carried parts, then install, check, test, validate, measure.

    python3 scripts/gpu/device_run.py stage                         # calls 1..N-1: keep .gpu/carry-K's part
    python3 scripts/gpu/device_run.py run --phase engine [--dry-run]  # call N (carries part N): checks, engine
    python3 scripts/gpu/device_run.py run --phase table [--dry-run]   # call N+1 (carries nothing): the table
    python3 scripts/gpu/device_run.py run [--dry-run]               # both phases in one call (a dry run here)
    python3 scripts/gpu/device_run.py unpack                        # stage, join, unpack and install only

``pack.py`` made the parts here; each device call carries one folder ``.gpu/carry-K`` and stages its
part in STAGE (outside the working tree, which each call replaces). ``run`` stages its own part too,
then, once per machine, joins the parts (sizes and sha256 checked against ``parts.json``), unpacks them,
installs the wheels into target folders (the service's; PyTriton's apart, with numpy < 2) and unpacks
wrk's .deb files (``dpkg -x``); a second ``run`` on the same warm machine finds them installed. Then, each
step with its own time limit so that one that hangs leaves the others their time:

- phase ``engine``: ``providers`` (ONNX Runtime's version and providers, a one-op session on CUDA that
  must land there; if it does not, the libraries it could not load are printed and the run stops);
  ``pytest`` (``pytest -m cuda``: tests/test_cuda.py on the tiny models, the engine's new CUDA paths
  included); ``inplace`` (GPT's fp16 in-place KV step graph against the Concat decoder,
  ``inplace_fp16.py``); ``bench_engine`` (``benchmarks/gpu.py --phase engine``: device KV buffers, CUDA
  graphs, TensorRT, pinned memory); with ``--with placement fp16``, node placement and the fp16 validation
  (both recorded by the run of 2026-11-27);
- phase ``table``: ``bench_table`` (``benchmarks/gpu.py --phase table``: KV cache vs recomputation,
  continuous batching, dynamic batching, served/raw, the wrk sweep, Triton on the same fp16 file).

Everything lands in $OUT (at most eight files): ``summary.json`` (each step's status and seconds),
``logs.tar.gz`` (each step's output), ``inplace_fp16.json``, ``bench.json``, ``RESULTS.md``, and with
``fp16``, ``fp16.json`` and ``manifests.tar.gz``. ``--dry-run`` does the same on a machine without a GPU,
with the CUDA steps skipped (the provider check only reports): the packing, joining, installing and every
script's wiring are then what is left to chance.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CARRY = Path(os.environ.get("GPU_CARRY", ROOT / ".gpu"))  # where this call's carried folder landed
STAGE = Path(os.environ.get("GPU_STAGE", "/tmp/gpu-stage"))
WORK = Path(os.environ.get("GPU_WORK", "/tmp/gpu-work"))
# Seconds per step: the whole run must end inside one call's 600 s with time to spare.
LIMITS = {
    "install": 90,
    "triton_venv": 30,
    "install_triton": 60,
    "wrk": 20,
    "providers": 60,
    "placement": 60,
    "pytest": 120,
    "fp16": 180,
    "inplace": 60,
    "bench_engine": 150,
    "bench_table": 480,
}
BENCH_RESERVE_S = 75  # the longest single GPU benchmark (two servers started, three workloads each)
PHASES = ("engine", "table")
# The CUDA libraries ONNX Runtime's CUDA provider opens (CUDA 13, cuDNN 9), from the nvidia-* wheels.
CUDA_LIBRARIES: tuple[str, ...] = (
    "libcudart.so.13",
    "libcublas.so.13",
    "libcublasLt.so.13",
    "libcudnn.so.9",
    "libcufft.so.12",
    "libcurand.so.10",
    "libnvrtc.so.13",
)

PROVIDER_CHECK = r"""
import json, sys, numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
info = {"onnxruntime": ort.__version__, "file": ort.__file__, "available": ort.get_available_providers()}
graph = helper.make_graph(
    [helper.make_node("Add", ["a", "b"], ["c"])], "one_op",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "ab"],
    [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 10
try:
    ort.preload_dlls(msvc=False)
except Exception as exc:
    info["preload_error"] = repr(exc)
session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
x = np.arange(4, dtype=np.float32)
info["session_providers"] = session.get_providers()
info["result"] = session.run(None, {"a": x, "b": x})[0].tolist()
print(json.dumps(info))
sys.exit(0 if info["session_providers"][0] == "CUDAExecutionProvider" and info["result"] == [0, 2, 4, 6] else 3)
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def stage() -> list[str]:
    """Copy the parts this call carried into STAGE; returns the names staged so far."""
    STAGE.mkdir(parents=True, exist_ok=True)
    for part in sorted(CARRY.glob("carry-*/*")):
        if part.name == "parts.json":
            shutil.copyfile(part, STAGE / "parts.json")
        elif not (STAGE / part.name).is_file() or (STAGE / part.name).stat().st_size != part.stat().st_size:
            shutil.copyfile(part, STAGE / part.name)
            log(f"staged {part.name} ({part.stat().st_size / 2**20:.1f} MiB)")
    return sorted(p.name for p in STAGE.iterdir() if p.name != "parts.json")


def join_and_unpack() -> list[str]:
    """Check each payload's parts against parts.json, join them and unpack into WORK; returns the payloads.

    "core" must be whole; another payload whose parts did not all come is left out, saying so.
    """
    listing = json.loads((STAGE / "parts.json").read_text())
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    unpacked = []
    for name, payload in listing["payloads"].items():
        missing = [p["name"] for p in payload["parts"] if not (STAGE / p["name"]).is_file()]
        if missing:
            if name == "core":
                raise SystemExit(f"parts not staged yet: {missing} (each earlier call must carry its folder)")
            log(f"payload {name} left out: parts not staged {missing}")
            continue
        digest = hashlib.sha256()
        joined = WORK / f"{name}.tar"
        with joined.open("wb") as out:
            for part in payload["parts"]:
                data = (STAGE / part["name"]).read_bytes()
                if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
                    raise SystemExit(f"{part['name']} is damaged: its size or sha256 differs from parts.json")
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != payload["sha256"]:
            raise SystemExit(f"the joined {name} payload's sha256 differs from parts.json")
        with tarfile.open(joined) as tar:
            tar.extractall(WORK, filter="data")
        joined.unlink()
        unpacked.append(name)
    log(f"unpacked {unpacked}: {sorted(p.name for p in WORK.iterdir())}")
    return unpacked


def cuda_library_dirs() -> list[str]:
    """Folders holding the CUDA libraries of the nvidia-* wheels on this python's path (and CUDA's own)."""
    roots = [Path(p) for p in sys.path if p and Path(p).is_dir()] + [Path("/usr/local/cuda/lib64")]
    found: list[str] = []
    for root in roots:
        for name in CUDA_LIBRARIES:
            for hit in glob.glob(str(root / "nvidia" / "**" / name), recursive=True) + glob.glob(
                str(root / name)
            ):
                folder = str(Path(hit).parent)
                if folder not in found:
                    found.append(folder)
    return found


def environment(dry_run: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(WORK / "site"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    env["DATA_DIR"] = str(WORK / "data")
    env["TEST_MODELS_DIR"] = str(WORK / "tiny-models")
    env["ORT_DISABLE_TELEMETRY"] = "1"
    if not dry_run:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*cuda_library_dirs(), env.get("LD_LIBRARY_PATH", "")]
        ).rstrip(os.pathsep)
    return env


def install_command(wheels_folder: str = "wheels", site: str = "site") -> list[str]:
    """pip, offline, every carried wheel into WORK/site (on PYTHONPATH ahead of the machine's packages)."""
    wheels = sorted(str(p) for p in (WORK / wheels_folder).glob("*.whl"))
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    return [*command, "--no-cache-dir", "--upgrade", "--target", str(WORK / site), *wheels]


def install() -> int:
    return subprocess.run(install_command(), timeout=LIMITS["install"]).returncode


def unpack_debs() -> Path | None:
    """wrk and its LuaJIT from the carried .deb files, unpacked (``dpkg -x``) into WORK/wrk-root: the binary,
    or None when no .deb came."""
    debs = sorted((WORK / "debs").glob("*.deb"))
    if not debs:
        return None
    root = WORK / "wrk-root"
    for deb in debs:
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True, timeout=LIMITS["wrk"])
    binary = root / "usr" / "bin" / "wrk"
    return binary if binary.is_file() else None


def triton_venv_command() -> list[str]:
    """A venv for PyTriton (``--system-site-packages``: the machine's packages under its own), made offline."""
    return [
        sys.executable,
        "-m",
        "venv",
        "--system-site-packages",
        "--without-pip",
        str(WORK / "triton-venv"),
    ]


def install_triton_command() -> list[str]:
    """PyTriton's wheels into its venv's site-packages (numpy < 2 ahead of the machine's): a real
    site-packages, where PyTriton looks for tritonserver's bundled libraries and its backend stub finds the
    same packages as the server."""
    venv_python = WORK / "triton-venv" / "bin" / "python"
    found = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    purelib = Path(found.stdout.strip())
    # After the venv's own: the service's packages (onnxruntime-gpu, tokenizers), then this python's (the
    # machine's image is a venv itself, whose packages a venv made from it would not see): .pth lines.
    import sysconfig

    (purelib / "gpu-run-site.pth").write_text(f"{WORK / 'site'}\n{sysconfig.get_paths()['purelib']}\n")
    wheels = sorted(str(p) for p in (WORK / "triton-wheels").glob("*.whl"))
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    return [*command, "--no-cache-dir", "--upgrade", "--target", str(purelib), *wheels]


def triton_python() -> Path:
    return WORK / "triton-venv" / "bin" / "python"


class Steps:
    """Runs the steps, each under its time limit and the run's deadline, and keeps what each did.

    Each step's output goes to its own log in WORK/logs, and after every step the logs are packed
    into $OUT/logs.tar.gz and the summary rewritten: a run cut short still brings back what it did.
    """

    def __init__(self, out: Path, env: dict[str, str], deadline: float, keep_logs: bool = False) -> None:
        self.out, self.env, self.deadline = out, env, deadline
        self.logs = WORK / "logs"
        if not keep_logs:  # a second call on a warm machine brings back the first one's logs too
            shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "steps": {}}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, cmd: list[str]) -> int:
        limit = max(1.0, min(LIMITS[name], self.left()))
        log(f"step {name} (at most {limit:.0f} s): {' '.join(cmd)}")
        started = time.perf_counter()
        log_file = self.logs / f"{name}.log"
        with log_file.open("w") as sink:
            # A session of its own: at the limit the whole group goes, the servers a benchmark started too.
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = 124
                log(f"step {name}: stopped at its {limit:.0f} s limit")
        seconds = round(time.perf_counter() - started, 1)
        self.summary["steps"][name] = {"exit": code, "seconds": seconds}
        log(f"step {name}: exit {code} in {seconds} s")
        tail = log_file.read_text(errors="replace").splitlines()[-12:]
        print("\n".join(f"    {line[:300]}" for line in tail), flush=True)
        self.write()
        return code

    def note(self, name: str, value: Any) -> None:
        self.summary[name] = value
        self.write()

    def write(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            tar.add(self.logs, "logs")


def gpu_names() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listed.stdout.strip() if listed.returncode == 0 else None


def prepared(listing: Path) -> bool:
    """Whether this machine already joined, unpacked and installed these parts (an earlier call's run)."""
    marker = WORK / ".installed"
    return marker.is_file() and marker.read_text() == hashlib.sha256(listing.read_bytes()).hexdigest()


def run(dry_run: bool, seconds: float, phase: str, skip: set[str], extra_steps: set[str]) -> int:
    deadline = time.monotonic() + seconds
    out = Path(os.environ.get("OUT", "/tmp/gpu-out"))
    out.mkdir(parents=True, exist_ok=True)
    staged = stage()
    log(f"staged parts: {staged}")
    fresh = not prepared(STAGE / "parts.json")
    payloads = join_and_unpack() if fresh else json.loads((WORK / ".payloads").read_text())
    env = environment(dry_run)
    steps = Steps(out, env, deadline, keep_logs=not fresh)
    steps.note("phase", phase)
    steps.note("payloads", payloads)
    steps.note("cuda_library_dirs", env.get("LD_LIBRARY_PATH", ""))
    steps.note("gpu", gpu_names())
    if fresh:
        if steps.run("install", install_command()) != 0:
            return 1
        if (WORK / "triton-wheels").is_dir() and steps.run("triton_venv", triton_venv_command()) == 0:
            steps.run("install_triton", install_triton_command())
        (WORK / ".payloads").write_text(json.dumps(payloads))
        (WORK / ".installed").write_text(hashlib.sha256((STAGE / "parts.json").read_bytes()).hexdigest())
    wrk = unpack_debs()
    if wrk is not None:
        env["WRK"] = str(wrk)
        libs = wrk.parents[1] / "lib" / "x86_64-linux-gnu"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [env.get("LD_LIBRARY_PATH"), str(libs)]))
    steps.note("wrk", str(wrk))
    python = sys.executable
    models = WORK / "models"
    if phase in ("engine", "all"):
        code = steps.run("providers", [python, "-c", PROVIDER_CHECK])
        if code != 0 and not dry_run:
            cuda_so = WORK / "site" / "onnxruntime" / "capi" / "libonnxruntime_providers_cuda.so"
            if cuda_so.is_file():
                ldd = subprocess.run(["ldd", str(cuda_so)], capture_output=True, text=True, env=env).stdout
                missing = [line.strip() for line in ldd.splitlines() if "not found" in line]
                steps.note("cuda_provider_missing_libraries", missing)
                log(f"libonnxruntime_providers_cuda.so cannot find: {missing}")
            return 1
        if models.is_dir() and "placement" in extra_steps:  # where each node of the served graphs runs
            placement = [python, "scripts/gpu/placement.py", "--models", str(models)]
            steps.run("placement", [*placement, "--json", str(steps.logs / "placement.json")])
        pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-rs"]
        if "pytest" not in skip:  # the CUDA tests skip themselves in a dry run
            steps.run("pytest", [*pytest, "tests/test_cuda.py"])
        if models.is_dir() and "fp16" in extra_steps:
            validate = [python, "scripts/gpu/validate_fp16.py", "--models", str(models)]
            validate += ["--json", str(out / "fp16.json"), *(["--dry-run"] if dry_run else [])]
            steps.run("fp16", validate)
            with tarfile.open(out / "manifests.tar.gz", "w:gz") as tar:
                for manifest in sorted(models.glob("*/manifest.json")):
                    tar.add(manifest, f"{manifest.parent.name}/manifest.json")
        if (models / "gpt").is_dir() and "inplace" not in skip:
            inplace = [python, "scripts/gpu/inplace_fp16.py", "--model", str(models / "gpt")]
            inplace += ["--json", str(out / "inplace_fp16.json"), "--device", "cpu" if dry_run else "cuda"]
            steps.run("inplace", inplace)
    for part in PHASES:
        if phase not in (part, "all") or not models.is_dir() or f"bench_{part}" in skip:
            continue
        budget = max(0.0, steps.left() - BENCH_RESERVE_S)  # the last benchmark started must end in time
        bench = [python, "benchmarks/gpu.py", "--phase", part, "--models", str(models)]
        bench += ["--json", str(out / f"bench_{part}.json"), "--results", str(out / "RESULTS.md")]
        bench += ["--device", "cpu" if dry_run else "cuda", "--out-dir", str(WORK / "plots")]
        bench += ["--budget-s", f"{budget:.0f}", *(["--quick"] if dry_run else [])]
        if triton_python().is_file():
            bench += ["--triton-python", str(triton_python())]
        steps.run(f"bench_{part}", bench)
    steps.note("finished", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    failed = [name for name, step in steps.summary["steps"].items() if step["exit"] != 0]
    if dry_run:  # no GPU here: the provider check only reports that CUDA is missing
        failed = [name for name in failed if name != "providers"]
    log(f"done; failed steps: {failed or 'none'}")
    return 1 if failed else 0


def probe() -> None:
    """What the first call should learn while the rest is still on its way: GPU, python, CUDA libraries."""
    log(f"GPU: {gpu_names()}; python {sys.version.split()[0]} at {sys.executable}")
    dirs = cuda_library_dirs()
    for name in CUDA_LIBRARIES:
        where = [d for d in dirs if (Path(d) / name).exists()]
        log(f"  {name}: {where[0] if where else 'NOT FOUND'}")
    versions = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.splitlines()
    wanted = ("numpy", "onnx", "onnxruntime", "protobuf", "pytest", "pytest-timeout", "torch", "nvidia-cudnn")
    log("  " + ", ".join(v for v in versions if v.lower().startswith(wanted)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["stage", "unpack", "run"])
    parser.add_argument("--dry-run", action="store_true", help="no GPU here: skip the CUDA steps")
    parser.add_argument("--probe", action="store_true", help="with stage: say what the machine has")
    parser.add_argument("--phase", choices=[*PHASES, "all"], default="all", help="which steps (see above)")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["pytest", "inplace", "bench_engine", "bench_table"],
        help="steps to leave out",
    )
    parser.add_argument(
        "--with",
        dest="extra_steps",
        nargs="*",
        default=[],
        choices=["placement", "fp16"],
        help="steps to add",
    )
    parser.add_argument(
        "--seconds", type=float, default=540, help="the whole run's deadline (a device call stops at 600 s)"
    )
    args = parser.parse_args()
    if args.action == "stage":
        log(f"staged parts: {stage()}")
        if args.probe:
            probe()
        return 0
    if args.action == "unpack":
        stage()
        join_and_unpack()
        return install()
    return run(args.dry_run, args.seconds, args.phase, set(args.skip), set(args.extra_steps))


if __name__ == "__main__":
    sys.exit(main())
