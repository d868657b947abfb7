"""Which execution provider ONNX Runtime puts each node of the served graphs on, with CUDA asked for.

    python scripts/gpu/placement.py --models DIR [--json FILE]

A session on CUDA that lands some nodes on the CPU provider still reports CUDA first; the copies
around those nodes can cost more than the nodes. ONNX Runtime says where each node went only in its
verbose log ("Node placements"), so each graph is opened in a child process with verbose logging,
and the placement lines are kept: per graph, nodes on each provider and the op types left on CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = r"""
import sys, onnxruntime as ort
ort.set_default_logger_severity(0)
options = ort.SessionOptions()
options.log_severity_level = 0
for path in sys.argv[1:]:
    print(f"=== {path}", file=sys.stderr, flush=True)
    ort.InferenceSession(path, options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    sys.stderr.flush()
"""
MARK = "=== "
PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")
NODE = re.compile(r"^\s+(\S+) \(")  # "  Shape (/bert/Shape)": a node's op type and name
LOG_PREFIX = re.compile(
    r"^\S+ \S+ \[\w:onnxruntime:[^\]]*\] ?"
)  # "2026-11-27 02:55:08.1 [V:onnxruntime:, x.cc:1 F] "
RAW_KEPT = 60  # the CPU provider's placement lines kept as they are, whatever their format


def parse(log: str) -> dict[str, dict[str, Any]]:
    """Per ``=== path`` section of a verbose log: nodes per provider, the op types on CPU, and the CPU lines raw.

    ONNX Runtime writes the placement as a header per provider and, for a provider without every node,
    a line per node (op type, then its name in parentheses), each behind the log's own prefix or as
    the continuation of the header's line.
    """
    found: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    provider = None
    for line in log.splitlines():
        if line.startswith(MARK):
            current = found.setdefault(line[len(MARK) :], {"nodes": {}, "cpu_ops": {}, "cpu_raw": []})
            provider = None
            continue
        if current is None:
            continue
        body = LOG_PREFIX.sub("", line)
        match = PLACED.search(body)
        if match:
            provider = match.group(2)
            current["nodes"][provider] = current["nodes"].get(provider, 0) + int(match.group(3))
            continue
        node = NODE.match(body)
        if node and provider == "CPUExecutionProvider":
            current["cpu_ops"][node.group(1)] = current["cpu_ops"].get(node.group(1), 0) + 1
            if len(current["cpu_raw"]) < RAW_KEPT:
                current["cpu_raw"].append(body.strip())
        elif body.strip():
            provider = None
    return found


def placements(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Per graph file: nodes per provider and the op types on CPU (one child process, CUDA set up once)."""
    args = [sys.executable, "-c", CHILD, *map(str, paths)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    found = parse(proc.stderr)
    if proc.returncode != 0 or not found:
        found["error"] = {"exit": proc.returncode, "log_tail": proc.stderr.splitlines()[-20:]}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    files: dict[str, Path] = {}
    for manifest_path in sorted(args.models.glob("*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        if "fp16" not in manifest.get("variants", {}):  # the benchmarks' models (pack.py's core payload)
            continue
        graphs = {f"reference/{g}": e["file"] for g, e in manifest["graphs"].items()}
        graphs |= {f"fp16/{g}": f for g, f in manifest["variants"]["fp16"]["graphs"].items()}
        files |= {f"{manifest_path.parent.name}/{k}": manifest_path.parent / f for k, f in graphs.items()}
    by_path = placements(list(files.values()))
    report: dict[str, object] = {"error": by_path["error"]} if "error" in by_path else {}
    for key, path in files.items():
        report[key] = by_path.get(str(path), {})
        print(f"{key}: {report[key]}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
