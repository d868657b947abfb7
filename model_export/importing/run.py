"""``python -m model_export import DIR --task TASK --name NAME``: a Hugging Face checkpoint as a served model folder.

1. ``checkpoint.inspect``: the family, the head, the files; a clear refusal for what cannot be served exactly.
2. ``tokenizer.served_tokenizer``: the checkpoint's ``tokenizer.json``, or its slow tokenizer converted
   and checked on text.
3. ``graphs``: the ``transformers`` model behind the house's signatures, exported and checked against
   torch by ``onnx_export.export_graph`` (and ``attention.onnx`` where the family has maps).
4. ``manifest.write_manifest`` with ``fields.manifest_fields`` and ``origin``: the folder, written as
   ``<name>.partial`` and renamed into place when whole, as a build does.
5. ``checks``: the served files against the checkpoint's own PyTorch model in ``transformers``, through
   the service's own pre- and post-processing; the figures go into the manifest (``checks``), and an
   import that misses one is refused.
6. ``variants.build_variants``: fused, int8, fp16 and the in-place KV step graph, each judged by the
   accuracy rule, measured on ``--data`` or on agreement with the reference (``agreement``).
7. ``--publish-version``: the whole folder built in ``<out>/.staging/`` and renamed to ``<out>/<name>/<N>``.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from ..attention_graphs import OUTPUT as ATTENTION_OUTPUT
from ..manifest import write_manifest
from ..onnx_export import OPSET, export_graph
from ..publish import PublishError, clear_staging, next_version, publish_version
from .checkpoint import ImportRefused, inspect, load_model
from .fields import manifest_fields
from .graphs import attention_graph, graphs
from .tokenizer import SAMPLE_TEXTS, served_tokenizer

log = logging.getLogger(__name__)

BUILDING = ".importing"


def import_checkpoint(
    folder: Path,
    task: str,
    name: str,
    out: Path,
    data: Path | None = None,
    publish: bool = False,
    variants: bool = True,
    seed: int = 0,
) -> Path:
    """Import the checkpoint in ``folder`` as model ``name`` of the repository ``out``; returns its folder."""
    from . import agreement, checks

    started = time.perf_counter()
    checkpoint = inspect(folder, task)
    examples = agreement.read_examples(data, task) if data is not None else None
    # The tokenizer and the manifest's fields before the weights and any folder: a malformed file is
    # refused at once.
    texts = [*SAMPLE_TEXTS, *agreement.source_texts(examples)]
    try:
        tokenizer, tokenizer_record = served_tokenizer(checkpoint, texts)
        fields = manifest_fields(checkpoint, tokenizer)
    except ImportRefused:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # A field of the checkpoint's files that no check above names: still a refusal, never a traceback.
        raise ImportRefused(
            f"a field of the checkpoint's tokenizer or config files is malformed "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    stage: Path | None = None
    if publish:
        try:
            next_version(out / name)  # refused before the import, not after it
        except PublishError as exc:
            raise ImportRefused(f"--publish-version: {exc}") from exc
        stage = clear_staging(out, name)
    repository = stage or out
    repository.mkdir(parents=True, exist_ok=True)
    model = load_model(checkpoint)

    # Built and checked in a hidden folder of the repository (the service passes over it, and the checks
    # load it under its own name), renamed into place only when whole and checked.
    build = repository / BUILDING / name
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    served = []
    if tokenizer is not None:
        tokenizer.save(str(build / "tokenizer.json"))
        served.append("tokenizer.json")
    exported = {}
    for role, spec in graphs(checkpoint, model, seed).items():
        exported[role] = export_graph(spec, build)
        served.append(spec.file)
    maps = attention_graph(checkpoint, model, seed)
    manifest: dict[str, Any] = {"name": name, **fields, "graphs": exported}
    if maps is not None:
        spec, kind = maps
        entry = export_graph(spec, build)
        served.append(spec.file)
        manifest["attention_maps"] = {
            **entry,
            "kind": kind,
            "num_layers": checkpoint.num_layers,
            "num_heads": checkpoint.num_heads,
            "output": ATTENTION_OUTPUT,
        }
    manifest["origin"] = {**checkpoint.origin(), "tokenizer": tokenizer_record}
    manifest["training"] = {"data": None, "objective": "none here: imported as it was trained (origin)"}
    manifest["export"] = {
        "exporter": "torch.onnx.export(dynamo=True) of transformers' own model (model_export/importing/wrappers.py)",
        "opset": OPSET,
        "torch": torch.__version__,
        "transformers": _transformers_version(),
        "python": platform.python_version(),
        "parity_max_abs_diff": max(g["parity_max_abs_diff"] for g in exported.values()),
    }
    write_manifest(build, manifest, served)
    figures = checks.run_checks(checkpoint, model, build, seed)
    _record(build, "checks", figures)
    final = repository / name
    shutil.rmtree(final, ignore_errors=True)
    build.rename(final)
    build.parent.rmdir() if not any(build.parent.iterdir()) else None
    log.info("%s: imported to %s; checks: %s", name, final, checks.summary(figures))
    if variants:
        agreement.build_import_variants(repository, name, checkpoint, model, examples)
    if stage is not None:
        final = publish_version(final, out / name)
    log.info("%s: import finished in %.0f s", name, time.perf_counter() - started)
    return final


def _record(folder: Path, key: str, value: Any) -> None:
    """A descriptive manifest section: the version (a hash of the served files) is unchanged."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest[key] = value
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)
