"""Load the model repository: one folder per model, each checked against its manifest before it serves.

A folder whose manifest is missing or malformed, whose files are missing or
differ from the recorded hashes, or whose graphs lack the inputs/outputs the
manifest names is refused with one clear log line; the other folders load.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tokenizers import Tokenizer

from .manifest import (
    FORMAT_VERSION,
    MANIFEST,
    TEXT_TASKS,
    GraphEntry,
    Manifest,
    content_version,
    file_sha256,
)
from .runtime import Graph, RemoteGraph, RuntimeOptions, expected_device
from .variants import REFERENCE, ServedVariant, ServingDevice, choose_variant, reference_of
from .versions import VersionFolder, VersionPolicyError, policy_of, version_folders

log = logging.getLogger(__name__)

# Tasks whose engine runs one loop over one set of sessions (continuous batching): MODEL_INSTANCES does not
# apply, and extra sessions would only hold memory.
SINGLE_INSTANCE_TASKS = frozenset({"text-generation"})
# Tasks whose one graph takes a whole batch of inputs at once: BERT heads, the embedder, ViT.
ENCODER_TASKS = frozenset(
    {
        "text-classification",
        "question-answering",
        "token-classification",
        "feature-extraction",
        "rerank",
        "image-classification",
    }
)


class ModelLoadError(Exception):
    pass


@dataclass
class LoadedModel:
    name: str
    path: Path
    manifest: Manifest
    graphs: dict[str, Graph]
    tokenizer: Tokenizer | None
    variant: ServedVariant  # which copy of the graphs these sessions run (service.engine.variants)
    # graph name -> its decoding step with the KV cache updated in place (CPU, KV_CACHE=inplace, where
    # the served variant has one): the engine decodes with it and prefills with ``graphs``
    inplace: dict[str, Graph] = field(default_factory=dict)
    # attention.onnx (the manifest's attention_maps), on CPU, run only for requests with return_attention
    attention: Graph | None = None
    label: str = ""  # its version folder's number (models/<name>/<label>/); "" for a flat model folder

    @property
    def task(self) -> str:
        return self.manifest.task

    def free(self) -> None:
        """Free every session of this model (once no request can reach it: ``InferenceService`` retires it)."""
        for graph in [
            *self.graphs.values(),
            *self.inplace.values(),
            *([self.attention] if self.attention else []),
        ]:
            graph.free()

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def instances(self) -> int:
        """Sessions per graph (MODEL_INSTANCES; 1 for a task that runs one loop, ``SINGLE_INSTANCE_TASKS``)."""
        return min(graph.instances for graph in self.graphs.values())

    @cached_property
    def request_span_attributes(self) -> dict[str, str]:
        """What a request's span says of the model that answers it (``service.observe.spans``)."""
        return {"inference.model.name": self.name, "inference.model.version": self.version}

    @cached_property
    def span_attributes(self) -> dict[str, str]:
        """What a trace's span of one of this model's runs says of it (``service.observe.spans``)."""
        return {
            "inference.model.name": self.name,
            "inference.model.version": self.version,
            "inference.model.variant": self.variant.name,
            "inference.device": "cuda" if any(g.on_cuda for g in self.graphs.values()) else "cpu",
        }

    @property
    def provider(self) -> str:
        return next(iter(self.graphs.values())).provider


def read_manifest(model_dir: Path) -> Manifest:
    path = model_dir / MANIFEST
    if not path.is_file():
        raise ModelLoadError(f"no {MANIFEST}")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{MANIFEST} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{MANIFEST} is not a JSON object")
    if raw.get("format_version") != FORMAT_VERSION:
        raise ModelLoadError(f"format_version {raw.get('format_version')} is not {FORMAT_VERSION}")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'manifest'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise ModelLoadError(f"{MANIFEST} does not match the contract: {problems}") from exc


def verify_files(model_dir: Path, manifest: Manifest, check_hashes: bool = True) -> None:
    files = manifest.files
    for name, entry in files.items():
        path = model_dir / name
        if not path.is_file():
            raise ModelLoadError(f"{name} is listed in the manifest but missing")
        if path.stat().st_size != entry.bytes:
            raise ModelLoadError(f"{name} has {path.stat().st_size} bytes, the manifest says {entry.bytes}")
        if check_hashes and file_sha256(path) != entry.sha256:
            raise ModelLoadError(f"{name} does not match its sha256 in the manifest")
    if content_version(files) != manifest.version:
        raise ModelLoadError("version is not the content hash of the listed files")
    for role, graph in manifest.graphs.items():
        if graph.file not in files:
            raise ModelLoadError(f"graph {role} file {graph.file} is not among the hashed files")
    for name, variant in manifest.variants.items():
        for role, file in (*variant.graphs.items(), *variant.inplace_decode.items()):
            if file not in files:
                raise ModelLoadError(f"variant {name} graph {role} file {file} is not among the hashed files")
    if manifest.task in TEXT_TASKS and "tokenizer.json" not in files:
        raise ModelLoadError("text model without tokenizer.json")


def _open_graph(
    model_dir: Path,
    file: str,
    options: RuntimeOptions,
    spec: GraphEntry | None = None,
    capture_runs: bool = False,
) -> Graph:
    """One session on ``file``; with ``spec``, its inputs and outputs must be exactly the declared ones."""
    try:
        graph = Graph(model_dir / file, options, capture_runs)
    except Exception as exc:  # ONNX Runtime raises its own exception types for broken graphs
        raise ModelLoadError(f"ONNX Runtime cannot load {file}: {exc}") from exc
    if spec is not None:
        for kind, declared, actual in (
            ("input", spec.inputs, graph.input_names),
            ("output", spec.outputs, graph.output_names),
        ):
            names = [io.name for io in declared]
            if names != actual:
                raise ModelLoadError(f"{file} {kind}s are {actual}, the manifest says {names}")
    return graph


def _open_graphs(
    model_dir: Path, manifest: Manifest, variant: ServedVariant, options: RuntimeOptions
) -> dict[str, Graph]:
    """One session per graph of ``variant``; each must have exactly the reference's inputs and outputs.
    CUDA graphs and TensorRT only for an encoder's one graph (``graph_options``)."""
    return {
        role: _open_graph(
            model_dir,
            variant.files[role],
            graph_options(options, manifest, role),
            spec,
            capture_runs=role in encoder_roles(manifest),
        )
        for role, spec in manifest.graphs.items()
    }


def encoder_roles(manifest: Manifest) -> frozenset[str]:
    """The graphs whose runs are a whole batch of fixed-size inputs (BERT heads, ViT): what TensorRT and CUDA
    graphs at padded shapes can take. Decoders' shapes grow every step (their step graph captures apart)."""
    return frozenset({"model"}) if manifest.task in ENCODER_TASKS else frozenset()


def graph_options(options: RuntimeOptions, manifest: Manifest, role: str) -> RuntimeOptions:
    """``options`` for one graph: CUDA graphs and TensorRT kept for an encoder's graph only, with the model's
    token window (TensorRT's shape profile, the length buckets)."""
    if role in encoder_roles(manifest):
        return dataclasses.replace(options, max_length=manifest.max_sequence_length or 0)
    return dataclasses.replace(options, cuda_graphs=False, tensorrt=False)


def _open_attention(model_dir: Path, manifest: Manifest, options: RuntimeOptions) -> Graph | None:
    """The attention-map graph, when the export wrote one: always on CPU (it is off the fast path)."""
    spec = manifest.attention_maps
    if spec is None:
        return None
    return _open_graph(model_dir, spec.file, dataclasses.replace(options, device="cpu", instances=1), spec)


def _inplace_here(variant: ServedVariant, device: ServingDevice) -> bool:
    """Whether ``variant``'s in-place step graphs run on ``device``: any on CPU; on CUDA, float16 ones only
    (GroupQueryAttention's CUDA kernel takes float16), whose buffers then stay on the device."""
    if not variant.inplace_decode:
        return False
    return device == "cpu" or variant.precision == "fp16"


def _served_device(graphs: dict[str, Graph]) -> ServingDevice:
    return "cuda" if all(g.on_cuda for g in graphs.values()) else "cpu"


def load_model(
    model_dir: Path, options: RuntimeOptions, check_hashes: bool = True, version: VersionFolder | None = None
) -> LoadedModel:
    """The model in ``model_dir``; with ``version``, the version folder ``version.path`` of the model folder
    ``model_dir`` (whose name the manifest must bear)."""
    name_dir = model_dir
    if version is not None and version.label:
        model_dir = version.path
    manifest = read_manifest(model_dir)
    verify_files(model_dir, manifest, check_hashes)
    if manifest.task in SINGLE_INSTANCE_TASKS and options.instances != 1:
        options = dataclasses.replace(options, instances=1)
    device = expected_device(options)
    variant = choose_variant(manifest, device, options.variant)
    graphs = _open_graphs(model_dir, manifest, variant, options)
    landed = _served_device(graphs)
    if landed != device:  # CUDA was expected but the sessions fell back: choose again for where they run
        again = choose_variant(manifest, landed, options.variant)
        if again != variant:
            variant, graphs = again, _open_graphs(model_dir, manifest, again, options)
    if variant.name != "reference" or manifest.variants:
        log.info(
            "%s serves its %s graphs (%s) on %s: %s",
            model_dir.name,
            variant.name,
            variant.precision,
            landed,
            variant.reason,
        )
    inplace: dict[str, Graph] = {}
    if options.kv_cache == "inplace" and _inplace_here(variant, landed):  # the cache updated in place
        # On CUDA the step graph's shapes repeat (a batch bucket, the buffers' length): CUDA graphs apply.
        step = dataclasses.replace(
            options, tensorrt=False, cuda_graphs=options.cuda_graphs and landed == "cuda"
        )
        inplace = {role: _open_graph(model_dir, file, step) for role, file in variant.inplace_decode.items()}
    attention = _open_attention(model_dir, manifest, options)
    tokenizer = None
    if (model_dir / "tokenizer.json").is_file():
        try:
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:
            raise ModelLoadError(f"tokenizer.json cannot be read: {exc}") from exc
    name = manifest.name or name_dir.name
    if name != name_dir.name:
        raise ModelLoadError(f"manifest name {name!r} differs from the folder name {name_dir.name!r}")
    label = version.label if version is not None else ""
    return LoadedModel(
        name, model_dir, manifest, graphs, tokenizer, variant, inplace, attention=attention, label=label
    )


def load_view(
    model_dir: Path, version: VersionFolder | None, variant_name: str, provider: str
) -> LoadedModel:
    """A model as a front end of the split service holds it: its manifest (hashes already checked by the
    engine process that loaded it), its tokenizer, the variant the engine serves, and ``RemoteGraph``s in
    place of its sessions, which live in the engine process."""
    name_dir = model_dir
    if version is not None and version.label:
        model_dir = version.path
    manifest = read_manifest(model_dir)
    variant = reference_of(manifest, "served by the engine process")
    if variant_name != REFERENCE:
        entry = manifest.variants[variant_name]
        variant = ServedVariant(
            variant_name,
            entry.precision,
            dict(entry.graphs),
            "served by the engine process",
            dict(entry.inplace_decode),
        )

    def placeholder(file: str, spec: GraphEntry) -> Graph:
        names = ([io.name for io in spec.inputs], [io.name for io in spec.outputs])
        return RemoteGraph(model_dir / file, *names, provider)  # type: ignore[return-value]

    graphs = {role: placeholder(variant.files[role], spec) for role, spec in manifest.graphs.items()}
    spec = manifest.attention_maps
    attention = placeholder(spec.file, spec) if spec is not None else None
    tokenizer = None
    if (model_dir / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    label = version.label if version is not None else ""
    return LoadedModel(
        manifest.name or name_dir.name, model_dir, manifest, graphs, tokenizer, variant, {}, attention, label
    )


def served_bytes(model_dir: Path, options: RuntimeOptions) -> int:
    """What the files a load of ``model_dir`` (one version folder, or a flat model folder) would open take
    on disk: the graphs of the variant it would serve on the expected device, their in-place KV step
    graphs where those are used, the attention-map graph and the tokenizer; never the variants it would
    not serve. 0 when the manifest cannot be read (the load itself then says why)."""
    try:
        manifest = read_manifest(model_dir)
    except ModelLoadError:
        return 0
    device = expected_device(options)
    variant = choose_variant(manifest, device, options.variant)
    files = set(variant.files.values())
    if options.kv_cache == "inplace" and _inplace_here(variant, device):
        files |= set(variant.inplace_decode.values())
    if manifest.attention_maps is not None:
        files.add(manifest.attention_maps.file)
    files.add("tokenizer.json")
    return sum(manifest.files[f].bytes for f in files if f in manifest.files)


def load_versions(
    model_dir: Path, options: RuntimeOptions, check_hashes: bool = True, policy: Any = None
) -> list[LoadedModel]:
    """Every version of the model folder that its policy serves (``versions.py``), newest first; the first
    that fails raises ``ModelLoadError`` naming its version, and the others are freed."""
    try:
        chosen = policy_of(model_dir, policy).choose(version_folders(model_dir))
    except VersionPolicyError as exc:
        raise ModelLoadError(str(exc)) from exc
    if not chosen:
        raise ModelLoadError(f"no {MANIFEST}, and no numbered version folder that its version policy serves")
    loaded: list[LoadedModel] = []
    try:
        for version in chosen:
            try:
                loaded.append(load_model(model_dir, options, check_hashes, version))
            except ModelLoadError as exc:
                raise ModelLoadError(
                    f"version {version.label}: {exc}" if version.label else str(exc)
                ) from exc
    except ModelLoadError:
        for model in loaded:
            model.free()
        raise
    return loaded


_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[^\s'\"/:,()]+/)+([^\s'\"/:,()]+)")


def without_paths(reason: str, root: Path | None = None) -> str:
    """A refusal's reason as callers see it (readiness is open to callers without a key): the repository's
    place on this host replaced by ``MODEL_REPOSITORY``, and any other absolute path cut to its last part
    (``.../model.onnx``). The log keeps the whole path for the operator."""
    if root is not None:
        for place in sorted({str(root.resolve()), str(root.absolute()), str(root)}, key=len, reverse=True):
            if place not in (".", ""):
                reason = reason.replace(place, "MODEL_REPOSITORY")
    return _ABSOLUTE_PATH.sub(r".../\1", reason)


def load_repository(
    root: Path,
    options: RuntimeOptions,
    only: list[str] | None = None,
    check_hashes: bool = True,
    policies: Mapping[str, Any] | None = None,
) -> tuple[dict[str, list[LoadedModel]], dict[str, str]]:
    """Every model folder under root (or only those named) -> (each model's served versions, newest first,
    by name; refusal reasons). ``policies``: version policies by model name (MODEL_VERSION_POLICY).

    ``only`` (SERVED_MODELS) names the folders to load; a name without a folder is refused with the
    others' reasons, so a pod told to serve a model it does not have says so (and is not ready when that
    was its only model).
    """
    loaded: dict[str, list[LoadedModel]] = {}
    failed: dict[str, str] = {}
    if not root.is_dir():
        log.error("model repository %s does not exist", root)
        return loaded, {"*": "the model repository (MODEL_REPOSITORY) does not exist; the log names its path"}
    for name in only or []:
        if not (root / name).is_dir():
            log.error("refusing model %s: SERVED_MODELS names it but %s has no such folder", name, root)
            failed[name] = "SERVED_MODELS names it but the model repository has no such folder"
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if model_dir.name.endswith(".partial") or (only is not None and model_dir.name not in only):
            continue
        try:
            versions = load_versions(model_dir, options, check_hashes, (policies or {}).get(model_dir.name))
        except ModelLoadError as exc:
            log.error("refusing model folder %s: %s", model_dir, exc)
            failed[model_dir.name] = without_paths(str(exc), root)
            continue
        loaded[model_dir.name] = versions
        for model in versions:
            label = f" {model.label}" if model.label else ""
            log.info(
                "loaded %s%s (%s, version %s) on %s",
                model.name,
                label,
                model.task,
                model.version,
                model.provider,
            )
    return loaded, failed
