"""(k) Resident memory after bursts of large refused bodies, per way of returning freed memory to the OS.

The same burst, side by side against one server per configuration: fifty concurrent ~4 MB bodies to
POST /v1/classify, each refused (a text too long, too many texts: 422; JSON that does not parse:
400), repeated; the server's VmRSS is read after warm-up and, after each burst, its lowest over 10 idle
seconds (where memory comes to rest). The
configurations are the candidates for keeping it bounded:

- the service's trimmer (``MALLOC_TRIM_MIB=32``, the default; ``service/models/memory.py``);
- glibc as it is (``MALLOC_TRIM_MIB=0``);
- ``MALLOC_ARENA_MAX=2`` (fewer per-thread heaps);
- a fixed ``MALLOC_MMAP_THRESHOLD_`` of 1 MiB (large blocks always mapped, so freed at once), alone and
  with ``MALLOC_TRIM_THRESHOLD_`` 128 KiB;
- jemalloc (``LD_PRELOAD``), where Debian's libjemalloc2 is installed;

all but the first with the trimmer off. Memory is the figure, not time: the table is what
docs/OPERATIONS.md ("Memory after bursts") chose from.

    python benchmarks/memory_bursts.py --models models [--bursts 6] [--per-burst 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/memory_bursts.py` anywhere

from benchmarks.cli import main
from benchmarks.options import Options
from benchmarks.repository import find_model, subset_repository
from benchmarks.results import Check, Result
from benchmarks.server import benchmark_server
from harness.http_client import HTTPConnection

NAME = "memory_bursts"
TITLE = "(k) Resident memory after bursts of large refused bodies: the trimmer vs the allocator's settings"
BODY_BYTES = 4_000_000
TARGET_GROWTH_MIB = 100.0  # the trimmer's growth after the last burst, at most
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")

CONFIGURATIONS: dict[str, dict[str, str]] = {
    "trimmer (MALLOC_TRIM_MIB=32, the default)": {},
    "trimmer and MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2"},
    "glibc as it is": {"MALLOC_TRIM_MIB": "0"},
    "MALLOC_ARENA_MAX=2": {"MALLOC_TRIM_MIB": "0", "MALLOC_ARENA_MAX": "2"},
    "MALLOC_MMAP_THRESHOLD_=1 MiB": {"MALLOC_TRIM_MIB": "0", "MALLOC_MMAP_THRESHOLD_": "1048576"},
    "MALLOC_MMAP_THRESHOLD_=1 MiB, MALLOC_TRIM_THRESHOLD_=128 KiB": {
        "MALLOC_TRIM_MIB": "0",
        "MALLOC_MMAP_THRESHOLD_": "1048576",
        "MALLOC_TRIM_THRESHOLD_": "131072",
    },
    "jemalloc (LD_PRELOAD)": {"MALLOC_TRIM_MIB": "0", "LD_PRELOAD": str(JEMALLOC)},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bursts", type=int, default=None, help="bursts per configuration (default 6, quick 1)"
    )
    parser.add_argument("--per-burst", type=int, default=None, help="bodies per burst (default 50, quick 4)")


def bodies() -> list[bytes]:
    return [
        json.dumps({"text": "a" * (BODY_BYTES - 20)}).encode(),  # 422: longer than MAX_TEXT_CHARS
        json.dumps({"texts": ["ab"] * (BODY_BYTES // 7)}).encode(),  # 422: more than MAX_ITEMS
        b'{"texts": ["' + b"x" * (BODY_BYTES - 20) + b'"',  # 400: JSON that does not parse
    ]


async def burst(port: int, payloads: list[bytes], count: int) -> list[int]:
    async def one(i: int) -> int:
        connection = HTTPConnection("127.0.0.1", port, timeout_s=300)
        try:
            response = await connection.request(
                "POST",
                "/v1/classify",
                payloads[i % len(payloads)],
                content_type="application/json",
            )
            return response.status
        finally:
            await connection.close()

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def resting_mib(pid: int, seconds: float = 10.0) -> float:
    """The lowest resident size over ``seconds`` of idleness: where memory rests after a burst (the
    trimmer looks every 1-4 s; the other configurations move by themselves or not at all)."""
    level = resident_mib(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        level = min(level, resident_mib(pid))
    return level


def run(opts: Options) -> Result:
    bursts = opts.extra.get("bursts") or (1 if opts.quick else 6)
    per_burst = opts.extra.get("per_burst") or (4 if opts.quick else 50)
    payloads = bodies()
    rows = []
    growth: dict[str, float] = {}
    classifier = find_model(opts.models, "text-classification")
    with subset_repository([classifier]) as repository:
        for label, env in CONFIGURATIONS.items():
            if "LD_PRELOAD" in env and not JEMALLOC.is_file():
                rows.append(f"| {label} | not installed ({JEMALLOC}) | | |")
                continue
            server = benchmark_server(
                repository, opts, env={"ACCESS_LOG": "false", "CACHE_ENABLED": "false", **env}
            )
            with server:
                assert server.proc is not None
                pid = server.proc.pid
                time.sleep(1)
                start = resident_mib(pid)
                levels, statuses = [], set()
                for _ in range(bursts):
                    statuses |= set(asyncio.run(burst(server.port, payloads, per_burst)))
                    levels.append(resting_mib(pid))
            growth[label] = levels[-1] - start
            rows.append(
                f"| {label} | {start:.0f} | {' / '.join(f'{x:.0f}' for x in levels)} | "
                f"{levels[-1] - start:+.0f} | {', '.join(map(str, sorted(statuses)))} |"
            )
    trimmer = next(iter(CONFIGURATIONS))
    details = [
        "| configuration | MiB after warm-up | MiB after each burst | growth | statuses |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"{bursts} bursts of {per_burst} concurrent bodies of ~{BODY_BYTES / 1e6:.0f} MB to /v1/classify, every one "
        "refused; after each burst, the lowest VmRSS over 10 idle seconds. One server per configuration, one after the other.",
    ]
    return Result(
        name=NAME,
        title=TITLE,
        metrics={"memory_growth_mib": growth},
        checks=[
            Check(
                "trimmer: resident growth after the last burst",
                growth[trimmer],
                TARGET_GROWTH_MIB,
                False,
                " MiB",
            )
        ],
        details=details,
    )


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
