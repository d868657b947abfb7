"""Pack what a lent GPU machine lacks into carry folders, each small enough for one device call.

    python scripts/gpu/pack.py [--models models] [--tiny DIR] [--data DIR] [--part-mib 50]

The device tool sends the working tree plus at most 64 MiB a call, and the GPU machine has no
registry. So what it lacks goes into two tars, split into parts of ``--part-mib``, one part per folder
``.gpu/carry-K`` (git-ignored): call K names that folder in ``carry``, and
``scripts/gpu/device_run.py`` there stages, joins, checks and unpacks them. Every folder also holds
``parts.json`` (each part's size and sha256), so the run knows what it still lacks.

- core: the wheels (onnxruntime-gpu and every service dependency of ``requirements.lock`` for CPython
  3.12 on manylinux x86_64, the machine's python, except numpy, which it has); the test suite's tiny
  repository (``pytest -m cuda`` reads it there); the validation splits (and SST-2's training split,
  the embedder's centroids); the benchmarks' models (``--bench-models``) with fused fp32 and fp16
  graphs (``carried_model``);
- extra (optional: the run goes ahead without it): the other default models, fp16 graphs alone, for
  their fp16 validation pass.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.engine.manifest import content_version

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".gpu"
WHEEL_CACHE = ROOT / ".cache" / "gpu-wheels"
MIB = 1 << 20
CALL_LIMIT_MIB = 64  # the device tool's limit on what travels in one call, working tree included
# On the GPU machine already (its image's packages), so not carried: pins of these are left to it.
ON_MACHINE = {"numpy"}
# Sent whole (fused fp32 and fp16) for the GPU table; the other models send fp16 alone, for its check.
BENCH_MODELS = ("bert-classifier", "gpt", "translator", "vit")
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def locked_requirements(lock: Path) -> list[str]:
    """``name==version`` for every line of the lock that applies on Linux x86_64, minus ON_MACHINE."""
    pins = []
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(;.*)?$", line)
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker and ("!= 'Linux'" in marker or '!= "Linux"' in marker):
            continue  # the non-Linux alternative (onnxruntime for CPUs)
        if name.lower() not in ON_MACHINE:
            pins.append(f"{name}=={version}")
    return pins


def download_wheels(pins: Iterable[str], python_version: str, cache: Path) -> list[Path]:
    """The wheels for ``pins`` on CPython ``python_version`` manylinux x86_64, from the registry once."""
    cache = (cache / python_version).resolve()  # one folder per python: pip picks each one's builds
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(cache)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *pins], check=True, cwd=cache)
    wanted = {_canonical(p.split("==")[0]): p.split("==")[1] for p in pins}
    found = [
        w
        for w in sorted(cache.glob("*.whl"))
        if wanted.get(_canonical(w.name.split("-")[0])) == w.name.split("-")[1]
    ]
    missing = set(wanted) - {_canonical(w.name.split("-")[0]) for w in found}
    if missing:
        raise SystemExit(f"no wheel for {sorted(missing)} in {cache}")
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried_model(folder: Path, reference: str) -> tuple[dict[str, Any], dict[str, Path]]:
    """A model folder trimmed for the GPU machine: its manifest and the files to send, by name.

    ``reference="fused"``: the fused fp32 graphs stand as the reference (they compute its function:
    the build checks their parity) with the fp16 variant beside them, for the benchmarks and the
    fp16 checks. ``reference="fp16"``: the fp16 graphs alone stand as the reference, for a validation
    pass only; the fp16 record rides along in ``carried``. Everything else stays here: the exported
    fp32 reference, int8, the in-place step graphs and the attention-maps graph. The trimmed manifest
    lists exactly the files sent (with a new content version), so the service loads it as it is.
    """
    manifest = json.loads((folder / "manifest.json").read_text())
    fp16 = manifest["variants"]["fp16"]
    graphs = {name: dict(entry) for name, entry in manifest["graphs"].items()}
    standing = manifest["variants"][reference]["graphs"] if reference in manifest["variants"] else None
    if standing is None:
        raise ValueError(f"{folder.name} has no {reference} variant to stand as its reference")
    for name, entry in graphs.items():
        entry["file"] = standing[name]
    kept = {name for name in standing.values()}
    variants = {}
    if reference != "fp16":
        kept |= set(fp16["graphs"].values())
        variants["fp16"] = {
            k: v for k, v in fp16.items() if k not in ("inplace_decode", "inplace_max_abs_diff")
        }
    graph_files = {e["file"] for e in manifest["graphs"].values()}
    for variant in manifest["variants"].values():
        graph_files |= set(variant["graphs"].values()) | set(variant.get("inplace_decode", {}).values())
    if manifest.get("attention_maps"):
        graph_files.add(manifest["attention_maps"]["file"])
    names = [name for name in manifest["files"] if name in kept or name not in graph_files]
    trimmed = dict(manifest)
    trimmed["graphs"], trimmed["variants"] = graphs, variants
    trimmed["files"] = {name: manifest["files"][name] for name in names}
    trimmed.pop("attention_maps", None)
    trimmed["version"] = content_version(trimmed["files"])
    trimmed["carried"] = {"reference": reference, "from_version": manifest["version"]}
    if reference == "fp16":
        trimmed["carried"]["fp16_record"] = fp16
    return trimmed, {name: folder / name for name in names}


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def build_payload(
    wheels: list[Path],
    tiny: Path | None,
    models: dict[str, tuple[Path, str]],
    data: Path | None,
) -> bytes:
    """One uncompressed tar (wheels are zips, graphs barely compress).

    ``models``: name -> (model folder, what stands as its reference: ``carried_model``).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for wheel in wheels:
            tar.add(wheel, f"wheels/{wheel.name}")
        if tiny is not None:
            for path in sorted(tiny.rglob("*")):
                rel = path.relative_to(tiny)
                if path.is_file() and rel.parts[0] != ".work":
                    tar.add(path, f"tiny-models/{rel.as_posix()}")
        for name, (folder, reference) in models.items():
            manifest, files = carried_model(folder, reference)
            _add_bytes(tar, f"models/{name}/manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
            for file, path in files.items():
                tar.add(path, f"models/{name}/{file}")
        if data is not None:
            for path in sorted(data.glob("*/validation*")):  # validation.*, validation-images-...
                tar.add(path, f"data/{path.parent.name}/{path.name}")
            # The embedder's centroids come from SST-2's training split (evaluate.py).
            tar.add(data / "sst2" / "train.tsv", "data/sst2/train.tsv")
    return buffer.getvalue()


def split(payloads: dict[str, bytes], part_bytes: int, out: Path) -> list[dict[str, Any]]:
    """``out/carry-K/<payload>-NN`` for each ``part_bytes`` of each payload, in order, and ``parts.json``.

    Each payload is joined on its own once all its parts are staged: the run goes ahead with "core"
    when an optional payload's parts did not all come.
    """
    shutil.rmtree(out, ignore_errors=True)
    parts: list[dict[str, Any]] = []
    listing: dict[str, Any] = {"payloads": {}}
    for payload_name, payload in payloads.items():
        names: list[dict[str, Any]] = []
        for start in range(0, len(payload), part_bytes):
            chunk = payload[start : start + part_bytes]
            name = f"{payload_name}-{len(names) + 1:02d}"
            folder = out / f"carry-{len(parts) + 1}"
            folder.mkdir(parents=True)
            (folder / name).write_bytes(chunk)
            part = {"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()}
            parts.append(part)
            names.append(part)
        listing["payloads"][payload_name] = {"sha256": hashlib.sha256(payload).hexdigest(), "parts": names}
    for index in range(1, len(parts) + 1):
        (out / f"carry-{index}" / "parts.json").write_text(json.dumps(listing, indent=1) + "\n")
    return parts


def tree_bytes(root: Path) -> int:
    """What the device tool sends besides the carries: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (root / name.decode()).stat().st_size for name in listed if name and (root / name.decode()).is_file()
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=str(ROOT / "models"), help="default repository ('' leaves it out)"
    )
    parser.add_argument(
        "--bench-models",
        default=",".join(BENCH_MODELS),
        help="sent with fused fp32 and fp16 graphs, in the core payload (the benchmarks use them)",
    )
    parser.add_argument(
        "--tiny", type=Path, default=None, help="the tiny repository (default: the newest built)"
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--part-mib", type=float, default=50)
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's python")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--wheel-cache", type=Path, default=WHEEL_CACHE)
    args = parser.parse_args()

    tiny = (
        args.tiny
        or max(
            (ROOT / ".cache" / "test-models").glob("*/evaluation.json"), key=lambda p: p.stat().st_mtime
        ).parent
    )
    wheels = download_wheels(
        locked_requirements(ROOT / "requirements.lock"), args.python_version, args.wheel_cache
    )
    bench, extra = {}, {}
    if args.models:
        with_fp16 = [
            p.parent
            for p in sorted(Path(args.models).glob("*/manifest.json"))
            if "fp16" in json.loads(p.read_text()).get("variants", {})
        ]
        wanted = set(args.bench_models.split(","))
        bench = {f.name: (f, "fused") for f in with_fp16 if f.name in wanted}
        extra = {f.name: (f, "fp16") for f in with_fp16 if f.name not in wanted}
    payloads = {"core": build_payload(wheels, tiny, bench, args.data)}
    if extra:
        payloads["extra"] = build_payload([], None, extra, None)
    parts = split(payloads, int(args.part_mib * MIB), args.out)
    tree = tree_bytes(ROOT)
    sizes = ", ".join(f"{name} {len(p) / MIB:.1f} MiB" for name, p in payloads.items())
    print(f"payloads: {sizes}; {len(parts)} parts; the working tree adds {tree / MIB:.1f} MiB a call")
    print(f"core models (fused + fp16): {sorted(bench)}; extra models (fp16 alone): {sorted(extra)}")
    for index, part in enumerate(parts, 1):
        total = (tree + part["bytes"]) / MIB
        print(
            f"  call {index}: carry .gpu/carry-{index}: {part['name']} ({part['bytes'] / MIB:.1f} MiB, {total:.1f} with the tree)"
        )
        if total > CALL_LIMIT_MIB - 1:
            raise SystemExit(
                f"call {index} would send {total:.1f} MiB, over the tool's {CALL_LIMIT_MIB}: lower --part-mib"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
