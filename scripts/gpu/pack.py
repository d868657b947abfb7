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
  GPT's carried folder gains its in-place step graph in float16 (``fp16_step``: the engine keeps its KV
  cache on the device with it) where the build did not write one; and Debian's ``wrk`` with the
  libraries it needs, as .deb files (``--debs``), which the run unpacks with ``dpkg -x``;
- triton (optional): PyTriton and what it needs that the machine lacks, numpy < 2 among them, installed
  apart (``triton-site``) for the Triton row of the GPU table;
- extra (optional, ``--extra``): the other default models, fp16 graphs alone, for their fp16 validation
  pass (already recorded in ``model_export/fp16_validation.json``: left out unless asked for).
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
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.cache import cache_root
from service.engine.manifest import content_version

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".gpu"
WHEEL_CACHE = ROOT / ".cache" / "gpu-wheels"
MIB = 1 << 20
CALL_LIMIT_MIB = 64  # the device tool's limit on what travels in one call, working tree included
# On the GPU machine already (its image's packages, docs in /work/.library/device/KINDS.md), so not carried:
# pins of these are left to it. pillow, uvloop: any recent version serves; ml-dtypes and hf-xet: not used
# when serving (onnx's, huggingface_hub's).
ON_MACHINE = {"numpy", "pillow", "uvloop", "ml-dtypes", "hf-xet"}
# PyTriton 0.7.0 and what it imports that neither the machine nor the core payload has (numpy < 2: PyTriton's
# pin; gevent and geventhttpclient: its client module, imported when the server starts).
TRITON_PINS = (
    "nvidia-pytriton==0.7.0",
    "numpy==1.26.4",
    "pyzmq==27.1.0",
    "sh==2.2.2",
    "typing-inspect==0.9.0",
    "mypy-extensions==1.1.0",
    "importlib-metadata==8.7.0",
    "zipp==3.23.0",
    "gevent==25.9.1",
    "greenlet==3.2.4",
    "zope-event==6.0",
    "zope-interface==8.0.1",
    "geventhttpclient==2.3.4",
    "brotli==1.1.0",
)
# Debian packages for the wrk sweep: wrk and the LuaJIT it links (libssl3 and libc are on the machine).
DEBS = ("wrk", "libluajit2-5.1-2")
# Sent whole (fused fp32 and fp16) for the GPU table; the other models send fp16 alone, for its check.
BENCH_MODELS = ("bert-classifier", "gpt", "translator", "vit")
# pip matches a manylinux_2_N tag exactly: the GPU machine's glibc is 2.39 (Ubuntu 24.04), and llguidance's
# wheels are manylinux_2_31, PyTriton's manylinux_2_35.
PLATFORMS = [
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
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


def download_debs(names: Iterable[str], cache: Path) -> list[Path]:
    """The .deb files of ``names`` from Debian's archive (apt-get download, no root needed), once."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [n for n in names if not list(cache.glob(f"{n}_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download", *missing], check=True, cwd=cache)
    return sorted(p for n in names for p in cache.glob(f"{n}_*.deb"))


def fp16_step(folder: Path, out: Path) -> tuple[str, Path, float] | None:
    """GPT's in-place step graph in float16 (``scripts/gpu/inplace_fp16.py``'s), written to ``out``, and its
    largest difference from the fp16 Concat step on ONNX Runtime's CPU provider; None for a model without a
    KV cache, or whose manifest already lists one."""
    manifest = json.loads((folder / "manifest.json").read_text())
    fp16 = manifest.get("variants", {}).get("fp16", {})
    if (
        manifest.get("kv_cache") is None
        or manifest.get("task") != "text-generation"
        or fp16.get("inplace_decode")
    ):
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from inplace_fp16 import write_step_graph

    from model_export.inplace_kv import step_difference

    path = write_step_graph(folder, out)
    name = fp16["graphs"]["model"].removesuffix(".onnx") + ".inplace.onnx"
    difference = step_difference(str(folder / fp16["graphs"]["model"]), str(path), manifest["kv_cache"])
    return name, path, difference


def with_step(manifest: dict[str, Any], files: dict[str, Path], step: tuple[str, Path, float]) -> None:
    """List ``step`` as the fp16 variant's in-place decoding graph in a carried manifest (and send it)."""
    name, path, difference = step
    data = path.read_bytes()
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest["variants"]["fp16"]["inplace_decode"] = {"model": name}
    manifest["variants"]["fp16"]["inplace_max_abs_diff"] = difference
    manifest["version"] = content_version(manifest["files"])
    files[name] = path


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
    if reference != "fp16":  # with its in-place step graph where the build wrote one (served on CUDA)
        kept |= set(fp16["graphs"].values()) | set(fp16.get("inplace_decode", {}).values())
        variants["fp16"] = dict(fp16)
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
    debs: list[Path] | None = None,
    wheel_folder: str = "wheels",
) -> bytes:
    """One uncompressed tar (wheels are zips, graphs barely compress).

    ``models``: name -> (model folder, what stands as its reference: ``carried_model``).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar, tempfile.TemporaryDirectory() as tmp:
        for wheel in wheels:
            tar.add(wheel, f"{wheel_folder}/{wheel.name}")
        for deb in debs or []:
            tar.add(deb, f"debs/{deb.name}")
        if tiny is not None:
            for path in sorted(tiny.rglob("*")):
                rel = path.relative_to(tiny)
                if path.is_file() and rel.parts[0] != ".work":
                    tar.add(path, f"tiny-models/{rel.as_posix()}")
        for name, (folder, reference) in models.items():
            manifest, files = carried_model(folder, reference)
            step = fp16_step(folder, Path(tmp)) if reference == "fused" else None
            if step is not None:
                with_step(manifest, files, step)
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
    """The payloads in order, cut into parts that fill ``out/carry-K`` folders of ``part_bytes`` each: a
    payload's last part and the next one's first share a folder where they fit (one call fewer), and every
    folder has ``parts.json``. Returns the parts, each with its ``folder`` (K).

    Each payload is joined on its own once all its parts are staged: the run goes ahead with "core"
    when an optional payload's parts did not all come.
    """
    shutil.rmtree(out, ignore_errors=True)
    parts: list[dict[str, Any]] = []
    listing: dict[str, Any] = {"payloads": {}}
    folder, used = 1, 0
    for payload_name, payload in payloads.items():
        names: list[dict[str, Any]] = []
        start = 0
        while start < len(payload):
            if used >= part_bytes:
                folder, used = folder + 1, 0
            chunk = payload[start : start + part_bytes - used]
            start += len(chunk)
            used += len(chunk)
            name = f"{payload_name}-{len(names) + 1:02d}"
            (out / f"carry-{folder}").mkdir(parents=True, exist_ok=True)
            (out / f"carry-{folder}" / name).write_bytes(chunk)
            part = {"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()}
            parts.append({**part, "folder": folder})
            names.append(part)
        listing["payloads"][payload_name] = {"sha256": hashlib.sha256(payload).hexdigest(), "parts": names}
    for index in range(1, folder + 1):
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
    parser.add_argument("--part-mib", type=float, default=52)
    parser.add_argument("--no-triton", action="store_true", help="leave PyTriton out (no Triton row)")
    parser.add_argument("--extra", action="store_true", help="carry the other models' fp16 graphs too")
    parser.add_argument(
        "--debs", type=Path, default=ROOT / ".cache" / "gpu-debs", help="where the .deb files go"
    )
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's python")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--wheel-cache", type=Path, default=WHEEL_CACHE)
    args = parser.parse_args()

    tiny = (
        args.tiny
        or max(
            (cache_root() / "test-models").glob("*/evaluation.json"), key=lambda p: p.stat().st_mtime
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
    debs = download_debs(DEBS, args.debs)
    payloads = {"core": build_payload(wheels, tiny, bench, args.data, debs)}
    if not args.no_triton:
        triton = download_wheels(TRITON_PINS, args.python_version, args.wheel_cache / "triton")
        payloads["triton"] = build_payload(triton, None, {}, None, wheel_folder="triton-wheels")
    if extra and args.extra:
        payloads["extra"] = build_payload([], None, extra, None)
    parts = split(payloads, int(args.part_mib * MIB), args.out)
    tree = tree_bytes(ROOT)
    sizes = ", ".join(f"{name} {len(p) / MIB:.1f} MiB" for name, p in payloads.items())
    calls = len({p["folder"] for p in parts})
    print(
        f"payloads: {sizes}; {len(parts)} parts in {calls} calls; the working tree adds {tree / MIB:.1f} MiB a call"
    )
    print(f"core models (fused + fp16): {sorted(bench)}; extra models (fp16 alone): {sorted(extra)}")
    folders = sorted({p["folder"] for p in parts})
    for index in folders:
        held = [p for p in parts if p["folder"] == index]
        sent = sum(p["bytes"] for p in held)
        total = (tree + sent) / MIB
        names = " + ".join(f"{p['name']} ({p['bytes'] / MIB:.1f} MiB)" for p in held)
        print(f"  call {index}: carry .gpu/carry-{index}: {names}, {total:.1f} MiB with the tree")
        if total > CALL_LIMIT_MIB - 1:
            raise SystemExit(
                f"call {index} would send {total:.1f} MiB, over the tool's {CALL_LIMIT_MIB}: lower --part-mib"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
