"""What machine and libraries a build ran on: recorded in every manifest, printed with the build estimate."""

from __future__ import annotations

import os
import platform
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ["torch", "numpy", "tokenizers", "onnx", "onnxscript", "onnxruntime-gpu", "onnxruntime"]


@cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def gpu_name(memory: bool = False) -> str | None:
    """The first NVIDIA GPU's name (and memory), as nvidia-smi gives it; None where there is none."""
    import subprocess

    query = "name,memory.total" if memory else "name"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def torch_cpu_capability() -> str:
    """The kernel set PyTorch dispatches to (AVX512, AVX2, ...): ATEN_CPU_CAPABILITY can lower it."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def describe(threads: int) -> dict[str, Any]:
    """The manifest's `training.machine`: enough to tell two builds' conditions apart."""
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "avx512": any(flag.startswith("avx512") for flag in cpu_flags()),
        "torch_cpu_capability": torch_cpu_capability(),
        "torch_threads": threads,
        "os": f"{platform.system()} {platform.release()}",
        "libraries": library_versions(),
    }
