"""``python -m model_export variants``: optimized copies of every model's graphs, each proven and recorded.

For every graph of a model folder, beside the reference (fp32, exactly as exported, parity-checked
against torch; it stays and stays the reference):

- ``fused`` (fp32, CPU and CUDA): ONNX Runtime's transformer fusions plus our attention rewrite
  (``fusion.py``): attention, LayerNorm (+ residual) and GELU (+ bias) each one op;
- ``int8`` (CPU): the fused graph's weight matmuls in int8 (``quantize_rows.py``): weights per output
  column, activations quantized per row as they come, so a row's result never depends on its batch
  (ONNX Runtime's ``quantize_dynamic`` scales a whole batch tensor at once); a model whose int8 graphs
  would not run on ONNX Runtime's CPU provider has no int8 variant;
- ``fp16`` (CUDA): the fused graph in float16 with float32 inputs and outputs (the KV cache too),
  ONNX Runtime's ``convert_float_to_float16``.

Each variant's graphs are checked against the reference's on the same inputs (``parity_max_abs_diff``)
and evaluated on the same validation split with the same code (``evaluate.py``); the manifest records
its metrics, their difference from the reference, and whether it passes the accuracy rule: the
headline metric may drop by at most 0.01 (accuracy, F1 on 0-1 scales), 1 point (BLEU, SQuAD F1 on
0-100) or 0.05 bits per character, and a row's outputs may not depend on what shares its batch
(``batch_difference``: a variant that fails it is not even evaluated). Fused fp32 is the reference's
function (parity within ``FUSED_PARITY``): where int8 passes and serves on CPU, fused is accepted on
that parity without a validation pass of its own; otherwise it is evaluated like the others. The
service serves a variant by default only where both hold (``service/engine/variants.py``). fp16 is
evaluated where the export has CUDA (parity and batch independence on CUDA too). Elsewhere it is
written with its parity on ONNX Runtime's CPU provider, which runs it, and judged by the validation
recorded on a GPU machine for a build of the same recipe (``fp16_validation.json``, written by
``scripts/gpu/record_fp16.py``): served by default where that passed and this build's fp16 graphs
stand as near their reference as the validated ones did; with no such record, not validated and
not served by default.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import onnx

from service.engine.manifest import MANIFEST, KVCacheSpec, Manifest, content_version, file_sha256
from service.engine.variants import VariantChoice

from .fusion import fuse_attention, op_counts, optimize
from .inplace_kv import rewrite_inplace, step_difference
from .machine import cpu_model, gpu_name
from .quantize_rows import quantize_rows
from .variant_speed import speedup

log = logging.getLogger(__name__)

# task -> (headline metric, allowed drop, higher is better)
RULES: dict[str, tuple[str, float, bool]] = {
    "translation": ("bleu", 1.0, True),
    "text-classification": ("accuracy", 0.01, True),
    "question-answering": ("f1", 1.0, True),  # SQuAD F1, 0-100
    "token-classification": ("entity_f1", 0.01, True),
    "text-generation": ("bits_per_char", 0.05, False),
    "image-classification": ("accuracy", 0.01, True),
    "feature-extraction": ("centroid_accuracy", 0.01, True),
    "rerank": ("mrr_at_10", 0.01, True),
    # An imported checkpoint without the user's labelled data: the share of inputs on which the variant
    # answers as the reference does (model_export/importing/agreement.py)
    "agreement": ("agreement", 0.01, True),
}
METHODS = {
    "fused": "onnxruntime.transformers optimize_model (opt_level 0) + model_export.fusion.fuse_attention "
    "(ONNX Attention, opset 23)",
    "int8": "model_export.quantize_rows of the fused graph: MatMul with constant weights as "
    "MatMulIntegerToFloat, int8 weights per output column (|q| <= 64, exact on CPUs without VNNI), "
    "uint8 activations with one scale per row (QuantizeLinear, block = the row)",
    "fp16": "onnxruntime.transformers OnnxModel.convert_float_to_float16(keep_io_types=True) of the fused graph",
}
BATCH_TOLERANCE = 1e-4  # what the service's batched-vs-alone parity tests allow
FUSED_PARITY = 1e-4  # fused fp32 within this of the reference on the probe inputs: the same function
# int8 rounds every matmul: served by default only where it is also this much faster than fused fp32
# on the building machine (variant_speed.py). On a 2-core AVX2 EPYC: bert-classifier 1.17-1.22x (served:
# 1.28x), the translator's decoding step 1.02-1.06x (served 0.95x), GPT's 0.87-0.96x (served 0.86x); a
# margin inside the rounds' noise (about 5%) would decide the translator by chance
SPEED_MARGIN = 1.1
DEVICES = {"fused": ["cpu", "cuda"], "int8": ["cpu"], "fp16": ["cuda"]}
PRECISIONS = {"fused": "fp32", "int8": "int8", "fp16": "fp16"}
# Variants that get an in-place KV step graph (GroupQueryAttention: its CUDA kernel is fp16/bf16 only,
# and the fp16 graph keeps float32 inputs, so its cache would be cast, i.e. copied, every step)
INPLACE_VARIANTS = ("fused", "int8")
INPLACE_TASKS = {"text-generation": "model", "translation": "decoder"}  # task -> its decoder graph


_cuda: dict[str, bool] = {}


def _cuda_works(path: Path) -> bool:
    """Whether a session on ``path`` really gets CUDA (onnxruntime-gpu lists it on machines without a GPU).

    Probed once per process, with ONNX Runtime's own error log silenced: a failed CUDA load is the
    expected answer on a CPU machine."""
    if "works" not in _cuda:
        import onnxruntime as ort

        from service.engine.runtime import RuntimeOptions, create_session

        ort.set_default_logger_severity(4)
        try:
            create_session(path, RuntimeOptions(device="cuda"))
            _cuda["works"] = True
        except Exception:
            _cuda["works"] = False
        finally:
            ort.set_default_logger_severity(2)
    return _cuda["works"]


def _quantize(source: Path, target: Path) -> int:
    """``source``'s weight MatMuls in int8 with per-row activation scales (``quantize_rows.py``) at ``target``."""
    model = onnx.load(str(source))
    rewritten = quantize_rows(model)
    onnx.save(model, str(target))
    return rewritten


def _runs_on_cpu(path: Path) -> bool:
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session.run(None, _probe_feeds(session))
        return True
    except Exception as exc:  # a quantized contrib op ONNX Runtime cannot load or run
        log.warning("%s does not run on ONNX Runtime's CPU provider: %s", path.name, exc)
        return False


def _write_graphs(folder: Path, manifest: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Write every variant's graphs; returns variant -> graph name -> file (no int8 where it cannot run)."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    config = manifest.get("config", {})
    heads = int(config.get("num_heads") or 0)
    hidden = int(config.get("d_model") or config.get("hidden_size") or 0)
    files: dict[str, dict[str, str]] = {"fused": {}, "fp16": {}}
    for graph, entry in manifest["graphs"].items():
        reference = folder / entry["file"]
        stem = reference.name.removesuffix(".onnx")
        fused = optimize(reference, manifest["task"], heads, hidden)
        attention = fuse_attention(fused)
        del fused.graph.value_info[:]  # intermediate shapes as traced: stale after the rewrites
        fused_file = f"{stem}.fused.onnx"
        onnx.save(fused, str(folder / fused_file))
        log.info("%s/%s: %d attention block(s) fused by our rewrite", folder.name, graph, attention)
        half = OnnxModel(onnx.load(str(folder / fused_file)))
        with contextlib.redirect_stdout(io.StringIO()):  # it prints that shape inference cannot read
            half.convert_float_to_float16(keep_io_types=True)  # our fused attention: harmless here
        fp16_file = f"{stem}.fp16.onnx"
        half.save_model_to_file(str(folder / fp16_file))
        files["fused"][graph], files["fp16"][graph] = fused_file, fp16_file
    int8 = _write_int8(folder, files["fused"])
    return {"fused": files["fused"], **({"int8": int8} if int8 else {}), "fp16": files["fp16"]}


def _write_int8(folder: Path, fused: dict[str, str]) -> dict[str, str] | None:
    """Each fused graph with per-row int8 matmuls; None (and no files) where one of them cannot run."""
    written: dict[str, str] = {}
    for graph, fused_file in fused.items():
        int8_file = fused_file.replace(".fused.onnx", ".int8.onnx")
        try:
            rewritten = _quantize(folder / fused_file, folder / int8_file)
            runs = _runs_on_cpu(folder / int8_file)
        except Exception as exc:
            log.warning("%s/%s: quantizing the fused graph failed: %s", folder.name, graph, exc)
            runs = False
        written[graph] = int8_file
        if not runs:  # a model has int8 for every graph or not at all
            for file in written.values():
                (folder / file).unlink(missing_ok=True)
            log.warning("%s: no int8 variant", folder.name)
            return None
        log.info("%s/%s: %d weight matmul(s) in int8 with per-row scales", folder.name, graph, rewritten)
    return written


def _write_inplace(
    folder: Path, manifest: dict[str, Any], files: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    """Each CPU variant's decoder as an in-place KV step graph (``inplace_kv.py``); variant -> graph -> file."""
    graph = INPLACE_TASKS.get(manifest["task"])
    kv = manifest.get("kv_cache")
    written: dict[str, dict[str, str]] = {}
    if graph is None or kv is None:
        return written
    spec = KVCacheSpec.model_validate(kv)  # the manifest's kv_cache section, typed
    fused = onnx.load(str(folder / files["fused"][graph]))
    try:
        rewritten = rewrite_inplace(fused, spec.num_heads, spec.head_dim, spec.past_names)
    except ValueError as exc:
        log.warning("%s: no in-place KV step graph: %s", folder.name, exc)
        return written
    log.info("%s/%s: %d attention(s) now update the KV cache in place", folder.name, graph, rewritten)
    for variant in INPLACE_VARIANTS:
        if variant not in files:
            continue
        target = files[variant][graph].removesuffix(".onnx") + ".inplace.onnx"
        if variant == "int8":  # the fused step graph (q, k, v packed into one matmul), quantized per row
            step = onnx.ModelProto()
            step.CopyFrom(fused)
            quantize_rows(step)
            onnx.save(step, str(folder / target))
        else:
            onnx.save(fused, str(folder / target))
        written[variant] = {graph: target}
    return written


def _probe_feeds(session: Any, rows: int = 2, length: int = 9) -> dict[str, np.ndarray]:
    """Inputs every graph here takes, without padding (a padding query's output is unspecified)."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else (rows if i == 0 else length) for i, d in enumerate(spec.shape)]
        if spec.name.startswith("past_"):
            shape[2] = 0  # an empty past: the prefill
        if spec.type == "tensor(int64)":
            if "mask" in spec.name:
                feeds[spec.name] = np.ones(shape, np.int64)
            elif "position" in spec.name:
                feeds[spec.name] = np.tile(np.arange(shape[1], dtype=np.int64), (shape[0], 1))
            elif "token_type" in spec.name:
                feeds[spec.name] = np.zeros(shape, np.int64)
            else:
                feeds[spec.name] = rng.integers(5, 100, shape, dtype=np.int64)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _session(path: Path, device: str) -> Any:
    """A plain session on ONNX Runtime's CPU provider, or on CUDA through the service's own session maker."""
    if device == "cuda":
        from service.engine.runtime import RuntimeOptions, create_session

        return create_session(path, RuntimeOptions(device="cuda"))
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def parity(folder: Path, reference: dict[str, str], variant: dict[str, str], device: str = "cpu") -> float:
    """Largest |variant - reference| over every output of every graph, on the same probe inputs."""
    worst = 0.0
    for graph, ref_file in reference.items():
        ref = _session(folder / ref_file, device)
        new = _session(folder / variant[graph], device)
        feeds = _probe_feeds(ref)
        for a, b in zip(ref.run(None, feeds), new.run(None, feeds), strict=True):
            if a.size:
                worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
    return worst


def batch_difference(folder: Path, variant: dict[str, str], device: str = "cpu") -> float:
    """Largest |row in a batch of 3 - the same row alone| over every output of every graph.

    The service batches requests together, and its answers must not depend on what shares a batch
    (the tests compare batched with one-by-one answers at 1e-4). Anything that couples the rows, such
    as one activation scale per batch tensor (``quantize_dynamic``), shows here.
    """
    worst = 0.0
    for file in variant.values():
        session = _session(folder / file, device)
        feeds = _probe_feeds(session, rows=3)
        together = session.run(None, feeds)
        for row in range(3):
            alone = session.run(None, {k: v[row : row + 1] for k, v in feeds.items()})
            for a, b in zip(together, alone, strict=True):
                if b.size:
                    worst = max(worst, float(np.abs(a[row : row + 1].astype(np.float64) - b).max()))
    return worst


def _rule(task: str, reference: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    metric, tolerance, higher = RULES[task]
    delta = {
        k: round(float(measured[k]) - float(v), 4)
        for k, v in reference.items()
        if isinstance(v, int | float)
        and not isinstance(v, bool)
        and isinstance(measured.get(k), int | float)
        and k not in ("examples", "seconds", "windows", "tokens", "characters", "centroid_examples")
    }
    drop = -delta[metric] if higher else delta[metric]
    accurate = drop <= tolerance + 1e-9
    return {
        "metric": metric,
        "delta": delta,
        "tolerance": tolerance,
        "serve_by_default": accurate,
        "reason": (
            f"{metric} {measured[metric]:.4f} vs {reference[metric]:.4f} for the reference: "
            f"{'within' if accurate else 'beyond'} the allowed {'drop' if higher else 'rise'} of {tolerance:g}"
        ),
    }


def _refusal(task: str, why: str) -> dict[str, Any]:
    """The rule's answer for a variant it refuses whatever its accuracy: not served, so not evaluated.

    The build's time goes to what can be served: a validation pass (a minute for the translator's beams
    on the slow CPU class) would not change the answer.
    """
    return _unevaluated(task, False, f"not evaluated: {why}")


def _unevaluated(task: str, serve_by_default: bool, reason: str) -> dict[str, Any]:
    """The rule's record for a variant that gets no validation pass."""
    metric, tolerance, _ = RULES[task]
    return {
        "metric": metric,
        "tolerance": tolerance,
        "validation": None,
        "serve_by_default": serve_by_default,
        "reason": reason,
    }


def _same_function(task: str, parity_diff: float) -> dict[str, Any]:
    """Fused fp32 where int8 serves on CPU: the reference's function, so it needs no validation pass.

    Its outputs equal the reference's to rounding (checked on the probe inputs, and by the tests on
    every tiny model's greedy and beam tokens); its figures have always equalled the reference's to the
    fourth decimal. A whole-split pass would cost the build minutes (the translator's beams, QA's
    windows) to re-measure that. Where int8 is refused (fused is then what CPU serves) or the parity is
    looser than FUSED_PARITY, fused gets its pass like any variant.
    """
    return _unevaluated(
        task,
        True,
        f"fp32, its outputs within {parity_diff:.2g} of the reference's on the probe inputs, so its "
        "figures are the reference's (not evaluated again: int8 is what CPU serves here)",
    )


def _speed_refusal(task: str, speed: float) -> dict[str, Any]:
    """int8 that is not SPEED_MARGIN times as fast as fused here."""
    return _refusal(
        task,
        f"{speed:.2f}x the fused graphs' speed on {cpu_model()} at the service's shapes, "
        f"below the {SPEED_MARGIN:g}x that pays for its rounding, so fused is served",
    )


def _batch_refusal(task: str, batch_diff: float) -> dict[str, Any]:
    """A variant whose rows depend on their batch."""
    return _refusal(
        task,
        f"a row's outputs change by up to {batch_diff:.2g} with what shares its batch "
        f"(> {BATCH_TOLERANCE:g}), so answers would depend on other requests",
    )


def _save(folder: Path, manifest: dict[str, Any]) -> None:
    Manifest.model_validate(manifest)  # the contract, before the service ever sees it
    import json

    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


@dataclass(frozen=True)
class Scorer:
    """How a model folder's variants are measured when not on the house's data (an imported checkpoint):
    ``evaluate(variant, device)`` returns its figures, judged by ``RULES[rule]``."""

    evaluate: Callable[[VariantChoice, Literal["cpu", "cuda"]], dict[str, Any]]
    rule: str


def build_variants(
    models_dir: Path,
    name: str,
    data_dir: Path,
    split: str = "validation",
    limit: int | None = None,
    beam_size: int = 4,
    scorer: Scorer | None = None,
) -> dict[str, Any]:
    """Write, check, evaluate and record the fused, int8 and fp16 variants of one model; returns them.

    ``scorer``: measure on something else than the house's validation split (an imported checkpoint)."""
    import json

    from .evaluate import evaluate_model

    def evaluate(
        variant: VariantChoice = "reference", device: Literal["cpu", "cuda"] = "cpu"
    ) -> dict[str, Any]:
        if scorer is not None:
            return scorer.evaluate(variant, device)
        return evaluate_model(
            models_dir, name, data_dir, split, limit, beam_size, variant=variant, device=device
        )

    folder = models_dir / name
    manifest = json.loads((folder / MANIFEST).read_text())
    rule = scorer.rule if scorer is not None else manifest["task"]
    started = time.perf_counter()
    for old in manifest.get("variants", {}).values():  # a rebuild replaces the files of the last one
        for file in old["graphs"].values():
            manifest["files"].pop(file, None)
    for old in manifest.get("variants", {}).values():
        for file in old.get("inplace_decode", {}).values():
            manifest["files"].pop(file, None)
    files = _write_graphs(folder, manifest)
    inplace = _write_inplace(folder, manifest, files)
    reference_files = {g: e["file"] for g, e in manifest["graphs"].items()}
    for variant_files in (*files.values(), *inplace.values()):
        for file in variant_files.values():
            path = folder / file
            manifest["files"][file] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    manifest["version"] = content_version(manifest["files"])
    variants: dict[str, Any] = {}
    for variant, graphs in files.items():
        variants[variant] = {
            "graphs": graphs,
            "precision": PRECISIONS[variant],
            "fused": True,  # every variant is made from the fused graphs
            "devices": DEVICES[variant],
            "method": METHODS[variant],
            "op_counts": {
                g: op_counts(onnx.load(str(folder / f), load_external_data=False)) for g, f in graphs.items()
            },
            "serve_by_default": False,
            "reason": "not evaluated yet",
        }
        if variant in inplace:
            variants[variant]["inplace_decode"] = inplace[variant]
            variants[variant]["inplace_max_abs_diff"] = max(
                step_difference(str(folder / graphs[g]), str(folder / f), manifest["kv_cache"])
                for g, f in inplace[variant].items()
            )
    manifest["variants"] = variants
    _save(folder, manifest)  # the files are listed and hashed: the folder loads while we evaluate

    reference = evaluate()
    manifest.setdefault("validation", {})[split] = reference  # the same graphs, stamped with the new version
    cuda = _cuda_works(folder / files["fp16"][next(iter(files["fp16"]))])
    for variant in sorted(variants, key=lambda v: v == "fused"):  # fused last: it may not need its pass
        record = variants[variant]
        # fp16 is checked where it serves, on CUDA; without CUDA, on ONNX Runtime's CPU provider (its own
        # fp16 kernels, not CUDA's), for the record only
        on = "cuda" if variant == "fp16" and cuda else "cpu"
        try:
            record["parity_max_abs_diff"] = parity(folder, reference_files, files[variant], on)
            record["batch_max_abs_diff"] = batch_difference(folder, files[variant], on)
        except Exception as exc:
            if variant != "fp16":
                raise
            log.warning("%s fp16 does not run on the CPU provider: %s", name, exc)
        if variant == "fp16" and not cuda:
            record["validation"] = None
            recorded = recorded_fp16(manifest)
            if recorded is not None and record.get("parity_max_abs_diff") is not None:
                record.update(_recorded_rule(recorded, record["parity_max_abs_diff"], manifest["version"]))
                log.info("%s %s: %s", name, variant, record["reason"])
                continue
            record["reason"] = "not validated: no CUDA at export"
            if record.get("parity_max_abs_diff") is not None:
                record["reason"] += (
                    f" (on ONNX Runtime's CPU provider its outputs differ from the reference's by at most "
                    f"{record['parity_max_abs_diff']:.2g} on the probe inputs)"
                )
            continue
        if record["batch_max_abs_diff"] > BATCH_TOLERANCE:  # refused by the rule whatever its accuracy
            record.update(_batch_refusal(rule, record["batch_max_abs_diff"]))
            log.info("%s %s: %s", name, variant, record["reason"])
            continue
        if variant == "int8":  # int8 must also pay for its rounding on this machine (variant_speed.py)
            steps = (variants["fused"].get("inplace_decode"), record.get("inplace_decode"))
            record["speed_over_fused"] = speedup(
                folder, manifest["task"], files["fused"], files["int8"], *steps
            )
            if record["speed_over_fused"] < SPEED_MARGIN:
                record.update(_speed_refusal(rule, record["speed_over_fused"]))
                log.info("%s %s: %s", name, variant, record["reason"])
                continue
        if (
            variant == "fused"
            and variants.get("int8", {}).get("serve_by_default")  # no int8 where its graphs cannot run
            and record["parity_max_abs_diff"] <= FUSED_PARITY
        ):
            record.update(_same_function(rule, record["parity_max_abs_diff"]))
            log.info("%s %s: %s", name, variant, record["reason"])
            continue
        measured = evaluate(cast(VariantChoice, variant), "cuda" if variant == "fp16" else "cpu")
        record["validation"] = {
            k: v for k, v in measured.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        record.update(_rule(rule, reference, measured))  # rows already batch-invariant
        if "speed_over_fused" in record:
            record["reason"] += (
                f"; {record['speed_over_fused']:.2f}x the fused graphs' speed on {cpu_model()}"
            )
        log.info("%s %s: %s", name, variant, record["reason"])
    _save(folder, manifest)
    log.info("%s: variants written and evaluated in %.0f s", name, time.perf_counter() - started)
    return variants


def validate_on_cuda(
    models_dir: Path,
    name: str,
    data_dir: Path,
    split: str = "validation",
    limit: int | None = None,
    beam_size: int = 4,
    device: Literal["cpu", "cuda"] = "cuda",
) -> dict[str, Any]:
    """The fp16 variant of a model exported without CUDA, checked and evaluated on CUDA; recorded.

    What ``build_variants`` does for fp16 when the export has CUDA, for a folder built elsewhere
    (``scripts/gpu/``): parity with the reference and batch independence on CUDA, a validation pass
    on CUDA, and the accuracy rule against the reference's figures in the manifest. Everything is
    measured even where the batch rule already refuses, so the record says by how much. Returns the
    fp16 record, also written to the manifest. ``device="cpu"`` runs the same steps on ONNX Runtime's
    CPU provider (a dry run of the wiring, where no GPU is).
    """
    import json

    from .evaluate import evaluate_model
    from .machine import library_versions

    folder = models_dir / name
    manifest = json.loads((folder / MANIFEST).read_text())
    # A copy trimmed for a GPU machine (scripts/gpu/pack.py) may carry the fp16 graphs alone, standing
    # as its reference, with their record beside them: then no fp32 graph is there to compare with.
    alone = manifest.get("carried", {}).get("reference") == "fp16"
    record = manifest["carried"]["fp16_record"] if alone else manifest["variants"]["fp16"]
    reference_files = {g: e["file"] for g, e in manifest["graphs"].items()}
    graphs = reference_files if alone else record["graphs"]
    reference = manifest["validation"][split]
    if (
        limit is None
    ):  # the examples the reference was scored on (the build's eval_limit), the same first ones
        limit = reference.get("examples")
    started = time.perf_counter()
    if not alone:  # else the record keeps the parity measured where it was built (CPU provider)
        record["parity_max_abs_diff"] = parity(folder, reference_files, graphs, device)
    record["batch_max_abs_diff"] = batch_difference(folder, graphs, device)
    measured = evaluate_model(
        models_dir,
        name,
        data_dir,
        split,
        limit,
        beam_size,
        variant="reference" if alone else "fp16",
        device=device,
    )
    record["validation"] = {
        k: v for k, v in measured.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    record.update(_rule(manifest["task"], reference, measured))
    if record["batch_max_abs_diff"] > BATCH_TOLERANCE:
        batch = _batch_refusal(manifest["task"], record["batch_max_abs_diff"])
        record["serve_by_default"] = False
        record["reason"] = f"{batch['reason'].removeprefix('not evaluated: ')}; {record['reason']}"
    record["validated_on"] = {
        "provider": "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider",
        "device": gpu_name() or "CUDA device",
        "onnxruntime": library_versions().get("onnxruntime-gpu"),
    }
    record["validation_seconds"] = round(time.perf_counter() - started, 1)
    _save(folder, manifest)
    log.info("%s fp16 on CUDA: %s", name, record["reason"])
    return cast(dict[str, Any], record)


# fp16 validations measured on a GPU machine (scripts/gpu/record_fp16.py writes it from a GPU run)
FP16_RECORD = Path(__file__).with_name("fp16_validation.json")
# This build's fp16 graphs compute what the validated build's did if, on ONNX Runtime's CPU provider,
# they stay as near their reference: within twice the validated build's difference (float16 rounding
# of weights of the same recipe's scale), plus a little slack for a build whose own difference is tiny.
FP16_PARITY_FACTOR, FP16_PARITY_SLACK = 2.0, 1e-3


def recorded_fp16(manifest: dict[str, Any], record_path: Path = FP16_RECORD) -> dict[str, Any] | None:
    """The fp16 validation recorded on a GPU machine for a build of this model's recipe, if any.

    A build matches when it is the same model, profile and number of training steps as the one
    validated (``--steps`` or ``--steps-scale`` make another recipe). Returns the model's entry with
    the run's facts (device, ONNX Runtime, date, commit) merged in.
    """
    import json

    if not record_path.is_file():
        return None
    record = json.loads(record_path.read_text())
    entry = record["models"].get(manifest.get("name"))
    training = manifest.get("training", {})
    if entry is None or (entry["profile"], entry["steps"]) != (
        training.get("profile"),
        training.get("steps"),
    ):
        return None
    return {**{k: v for k, v in record.items() if k != "models"}, **entry}


def _recorded_rule(recorded: dict[str, Any], cpu_parity: float, version: str) -> dict[str, Any]:
    """fp16 of a build exported without CUDA, judged by a validation of its recipe's build on a GPU.

    Served by default where that validation passed the rule (accuracy and batch independence on
    CUDA) and this build's fp16 graphs stand as near their reference as the validated build's did.
    """
    same_graphs = version == recorded["version"]
    near = cpu_parity <= FP16_PARITY_FACTOR * recorded["cpu_parity_max_abs_diff"] + FP16_PARITY_SLACK
    which = (
        "these very graphs"
        if same_graphs
        else f"a build of this recipe ({recorded['profile']} profile, {recorded['steps']} steps)"
    )
    reason = (
        f"validated on {recorded['device']} with ONNX Runtime {recorded['onnxruntime']} ({recorded['date']}, "
        f"commit {recorded['git']}) for {which}: {recorded['metric']} {recorded['fp16']:.4f} vs "
        f"{recorded['reference']:.4f} for the reference, "
        f"{'within' if recorded['passes'] else 'beyond'} the allowed change of {recorded['tolerance']:g}; a row's "
        f"outputs change by at most {recorded['batch_max_abs_diff']:.2g} with its batch on CUDA"
    )
    if not same_graphs:
        reason += (
            f"; this build's fp16 outputs are within {cpu_parity:.2g} of its reference on ONNX Runtime's CPU "
            f"provider ({'near' if near else 'not near'} the validated build's {recorded['cpu_parity_max_abs_diff']:.2g})"
        )
    return {
        "metric": recorded["metric"],
        "tolerance": recorded["tolerance"],
        "validated_elsewhere": recorded,
        "serve_by_default": bool(recorded["passes"] and (same_graphs or near)),
        "reason": reason,
    }


def apply_recorded_fp16(folder: Path, record_path: Path = FP16_RECORD) -> dict[str, Any] | None:
    """Judge an exported folder's fp16 variant by the recorded GPU validation, in place; its record or None."""
    import json

    manifest = json.loads((folder / MANIFEST).read_text())
    fp16 = manifest.get("variants", {}).get("fp16")
    recorded = recorded_fp16(manifest, record_path)
    if fp16 is None or recorded is None or fp16.get("parity_max_abs_diff") is None:
        return None
    fp16.update(_recorded_rule(recorded, fp16["parity_max_abs_diff"], manifest["version"]))
    _save(folder, manifest)
    return cast(dict[str, Any], fp16)
