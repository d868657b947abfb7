"""The benchmarks' results: each ratio against its target, and the dated tables appended to RESULTS.md."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.options import ROOT, Options
from model_export.machine import gpu_name


@dataclass(frozen=True)
class Check:
    """One headline ratio against its target (never asserted: a MISS is reported, not raised)."""

    label: str
    value: float
    target: float
    higher_is_better: bool = True
    unit: str = "x"

    @property
    def passed(self) -> bool:
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def row(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        return (
            f"| {self.label} | {self.value:.2f}{self.unit} | {op} {self.target:g}{self.unit} | "
            f"{'PASS' if self.passed else 'MISS'} |"
        )

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "PASS" if self.passed else "MISS"
        return f"{self.label}: {self.value:.2f}{self.unit} (target {op} {self.target:g}{self.unit}) {verdict}"


@dataclass
class Result:
    name: str
    title: str
    metrics: dict[str, Any]  # the JSON figures (run_all's keys among them)
    checks: list[Check]
    details: list[str]  # markdown: tables and notes
    context: dict[str, str] = field(default_factory=dict)  # e.g. the execution provider
    seconds: float = 0.0


def print_result(result: Result) -> None:
    print(f"\n== {result.title} ({result.seconds:.0f}s)")
    print("\n".join(result.details))
    for check in result.checks:
        print(check.line())


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def vector_extensions(cpuinfo: str) -> str:
    """What the CPU offers ONNX Runtime's kernels, in words: AVX-512 (with VNNI, for int8) or not."""
    flags = next(
        (set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines() if line.startswith("flags")),
        set(),
    )
    if "avx512f" in flags:
        return "AVX-512 with VNNI" if "avx512_vnni" in flags else "AVX-512, no VNNI"
    return "AVX2, no AVX-512" if "avx2" in flags else "no AVX2, no AVX-512"


def machine_info() -> dict[str, Any]:
    cpuinfo = _read("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    meminfo = _read("/proc/meminfo")
    mem_kb = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")), 0)
    try:
        import onnxruntime as ort

        ort_version, available = ort.__version__, ort.get_available_providers()
    except ImportError:  # pragma: no cover - the service needs it
        ort_version, available = "missing", []
    return {
        "gpu": gpu_name(memory=True),
        "cpu": models[0] if models else platform.processor() or "unknown",
        "cores": len(models) or os.cpu_count() or 0,
        "vector_extensions": vector_extensions(cpuinfo),
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "onnxruntime": ort_version,
        "available_providers": available,
        "python": platform.python_version(),
        "git": git_revision(),
    }


def git_revision() -> str:
    if os.environ.get("GIT_REVISION"):  # a copy of the tree without .git (the GPU machine: scripts/gpu/)
        return os.environ["GIT_REVISION"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}{' (uncommitted changes in the tree)' if dirty else ''}"


def append_results(path: Path, results: Sequence[Result], opts: Options, title: str) -> None:
    """Append one dated section: the run's context, the headline ratios, then each benchmark's details."""
    info = machine_info()
    providers = sorted({r.context["provider"] for r in results if r.context.get("provider")})
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    threads = opts.threads or f"0 (one per core: {info['cores']})"
    lines = [
        f"## {now}: {title}{' (--quick: smoke-test sizes, not figures)' if opts.quick else ''}",
        "",
        "| date | machine | ONNX Runtime | provider | git | models | intra-op threads |",
        "|---|---|---|---|---|---|---|",
        f"| {now} | {'GPU ' + info['gpu'] + '; ' if info['gpu'] else ''}"
        f"{info['cpu']} ({info['vector_extensions']}), {info['cores']} cores, {info['ram_gib']} GiB RAM | "
        f"{info['onnxruntime']} | "
        f"{', '.join(providers) or 'n/a'} | {info['git']} | `{display_path(opts.models)}` | "
        f"{threads} |",
        "",
        f"Client and server share the {info['cores']} cores: the load generator (asyncio + uvloop, a minimal "
        "HTTP/1.1 client) costs at most ~0.1 core, and the tables give the CPU each process used ('cores': CPU "
        "time over wall time). The server runs with INTRA_OP_THREADS as above; its event loop (HTTP, JSON, "
        "tokenisation) competes with ONNX Runtime's threads for the same cores.",
        "",
    ]
    checks = [c for r in results for c in r.checks]
    if checks:
        lines += [
            "| figure | measured | target | verdict |",
            "|---|---|---|---|",
            *(c.row() for c in checks),
            "",
        ]
    for r in results:
        if len(results) > 1:
            lines += [f"### {r.title} ({r.seconds:.0f} s)", ""]
        lines += [*r.details, ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write(
                "# Benchmark results\n\nAppended by `python benchmarks/run_all.py` (or one benchmark script); "
                "newest last. Each figure is a ratio measured side by side in one run.\n\n"
            )
        f.write("\n".join(lines) + "\n")


def cores_used(cpu_s: float, seconds: float) -> str:
    return f"{cpu_s / seconds:.2f}" if seconds > 0 and cpu_s == cpu_s else "n/a"


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)
