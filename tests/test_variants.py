"""The export's graph variants (model_export/variants.py) on the tiny models the real CLI builds.

- the fusions really happened: op counts of the files on disk (every attention one op, no Softmax
  left, LayerNorm and GELU fused), and the manifest records those counts;
- fused fp32 computes what the reference computes (logits within 1e-4) and decodes the same greedy
  tokens (GPT through the service's DecoderGraph, the translator through Seq2SeqModel);
- int8 (per-row activation scales) does not couple the rows of a batch, is evaluated, and is
  recorded honestly: its metrics, their difference from the reference, and a serve_by_default that
  is exactly the accuracy rule;
- the service loads, by default on CPU, the variant the rule allows.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from model_export.variants import RULES, SPEED_MARGIN, parity
from service.engine.batcher import BatchPolicy
from service.engine.decoder_graph import DecoderGraph
from service.engine.manifest import Manifest
from service.engine.repository import load_model
from service.engine.runtime import RuntimeOptions
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.classify import TextClassifier

MODELS = [
    "bert-classifier",
    "bert-embedder",
    "bert-qa",
    "bert-reranker",
    "bert-tagger",
    "gpt",
    "translator",
    "vit",
]
FUSED_FP32_TOLERANCE = 1e-4  # the same arithmetic regrouped: float32 rounding, logits of order 1-10
FP16_TOLERANCE = 0.05
ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")


def _manifest(tiny_models: Path, name: str) -> dict[str, Any]:
    return json.loads((tiny_models / name / "manifest.json").read_text())


def _ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_has_validated_variants(tiny_models: Path, name: str) -> None:
    manifest = _manifest(tiny_models, name)
    Manifest.model_validate(manifest)
    assert set(manifest["variants"]) == {"fused", "int8", "fp16"}
    for variant in manifest["variants"].values():
        assert set(variant["graphs"]) == set(manifest["graphs"])
        for file in variant["graphs"].values():
            assert (tiny_models / name / file).is_file() and file in manifest["files"]


@pytest.mark.parametrize("name", MODELS)
def test_fusions_happened_in_every_graph(tiny_models: Path, name: str) -> None:
    manifest = _manifest(tiny_models, name)
    fused = manifest["variants"]["fused"]
    for graph, entry in manifest["graphs"].items():
        before = _ops(tiny_models / name / entry["file"])
        after = _ops(tiny_models / name / fused["graphs"][graph])
        assert dict(after) == fused["op_counts"][graph]  # the manifest records what is on disk
        # Each attention block had one Softmax (or was one fused op already); now each is one attention op
        # (ONNX or contrib) and no Softmax is left.
        blocks = before["Softmax"] + sum(before[op] for op in ATTENTION_OPS)
        assert blocks > 0
        assert sum(after[op] for op in ATTENTION_OPS) == blocks and after["Softmax"] == 0, (
            graph,
            dict(after),
        )
        # LayerNorm fused with its residual Add (SkipLayerNormalization) or, in BERT, with the embeddings'
        # sum (EmbedLayerNormalization): none is left alone, except in ViT, whose pre-norm blocks start
        # from LayerNorms of the patch embeddings that the optimizer leaves as they are.
        assert before["LayerNormalization"] > 0
        if manifest["architecture"] == "vit":
            assert after["LayerNormalization"] < before["LayerNormalization"], (graph, dict(after))
        else:
            assert after["LayerNormalization"] == 0, (graph, dict(after))
        if manifest["architecture"] == "bert":
            assert after["EmbedLayerNormalization"] == 1
        assert after["SkipLayerNormalization"] > 0
        # GELU (Erf and its arithmetic) with the bias Add before it is one op.
        assert after["Erf"] == 0 and after["BiasGelu"] + after["Gelu"] == before["Erf"]
        assert sum(after.values()) < sum(before.values())


@pytest.mark.parametrize("name", MODELS)
def test_fused_fp32_matches_the_reference(tiny_models: Path, name: str) -> None:
    manifest = _manifest(tiny_models, name)
    reference = {g: e["file"] for g, e in manifest["graphs"].items()}
    diff = parity(tiny_models / name, reference, manifest["variants"]["fused"]["graphs"])
    assert diff <= FUSED_FP32_TOLERANCE
    assert manifest["variants"]["fused"]["parity_max_abs_diff"] <= FUSED_FP32_TOLERANCE


def test_fused_gpt_decodes_the_reference_tokens(tiny_models: Path) -> None:
    prompt = [5, 17, 42, 9]
    tokens: dict[str, list[int]] = {}
    for variant in ("reference", "fused", "int8"):
        model = load_model(tiny_models / "gpt", RuntimeOptions(device="cpu", variant=variant))  # type: ignore[arg-type]
        assert model.variant.name == variant
        graph = DecoderGraph(model.graphs["model"], model.manifest)
        logits, cache = graph.prefill([prompt, prompt[:2]])
        out: list[int] = []
        for _ in range(20):
            step = np.argmax(logits, axis=-1).astype(np.int64)
            out.append(int(step[0]))
            logits, cache = graph.decode(step, cache)
        tokens[variant] = out
    assert tokens["fused"] == tokens["reference"]


def test_fused_translator_decodes_the_reference_tokens(tiny_models: Path) -> None:
    sources = [[12, 30, 7, 99, 3], [44, 5, 3]]
    hypotheses = {}
    for variant in ("reference", "fused"):
        model = load_model(tiny_models / "translator", RuntimeOptions(device="cpu", variant=variant))  # type: ignore[arg-type]
        seq2seq = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], model.manifest)
        greedy = [h.tokens for h in seq2seq.greedy(sources, 16)]
        beams = [[h.tokens for h in hs] for hs in seq2seq.beam_search(sources, 3, 16, num_return=2)]
        hypotheses[variant] = (greedy, beams)
    assert hypotheses["fused"] == hypotheses["reference"]


@pytest.mark.parametrize("name", MODELS)
def test_the_accuracy_rule_is_recorded_as_measured(tiny_models: Path, name: str) -> None:
    manifest = _manifest(tiny_models, name)
    metric, tolerance, higher = RULES[manifest["task"]]
    reference = manifest["validation"]["validation"]  # measured in the same run as the variants
    for variant_name in ("fused", "int8"):
        v = manifest["variants"][variant_name]
        assert v["metric"] == metric and v["tolerance"] == tolerance
        assert np.isfinite(v["parity_max_abs_diff"])
        if v["batch_max_abs_diff"] > 1e-4:  # refused before its accuracy is measured
            assert v["validation"] is None and not v["serve_by_default"]
            assert v["reason"].startswith("not evaluated: a row's outputs change")
            continue
        if variant_name == "int8" and v["speed_over_fused"] < SPEED_MARGIN:  # not worth its rounding here
            assert v["validation"] is None and not v["serve_by_default"]
            assert v["reason"].startswith(
                f"not evaluated: {v['speed_over_fused']:.2f}x the fused graphs' speed"
            )
            continue
        if variant_name == "fused" and manifest["variants"]["int8"]["serve_by_default"]:
            # int8 serves on CPU: fused (the reference's function) is accepted on its parity alone
            assert v["validation"] is None and v["serve_by_default"]
            assert v["parity_max_abs_diff"] <= FUSED_FP32_TOLERANCE
            assert "not evaluated again: int8 is what CPU serves here" in v["reason"]
            continue
        assert v["delta"][metric] == pytest.approx(v["validation"][metric] - reference[metric], abs=1e-3)
        drop = -v["delta"][metric] if higher else v["delta"][metric]
        assert v["serve_by_default"] == (drop <= tolerance + 1e-9)
    # fp32 fused and per-row int8: a row's answer does not depend on what shares its batch (int8's
    # scales are the row's own and its integer products exact), so int8 got its validation pass
    assert manifest["variants"]["fused"]["batch_max_abs_diff"] <= 1e-5
    assert manifest["variants"]["int8"]["batch_max_abs_diff"] <= 1e-5
    assert manifest["variants"]["int8"]["speed_over_fused"] > 0  # measured on this machine
    assert (
        manifest["variants"]["int8"]["op_counts"][next(iter(manifest["graphs"]))]["MatMulIntegerToFloat"] > 0
    )
    fp16 = manifest["variants"]["fp16"]
    assert fp16["validation"] is None and not fp16["serve_by_default"]  # no CUDA here: not validated
    assert fp16["reason"].startswith("not validated: no CUDA at export")
    # ... but ONNX Runtime's CPU provider runs it: float16 keeps 11 significant bits (relative rounding
    # 4.9e-4) through a few layers, on logits of order 1-10, so a few 1e-3; 0.05 would mean a real bug.
    assert fp16["parity_max_abs_diff"] is not None and fp16["parity_max_abs_diff"] <= FP16_TOLERANCE


@pytest.mark.parametrize("name", MODELS)
def test_the_service_serves_the_variant_the_rule_allows_on_cpu(tiny_models: Path, name: str) -> None:
    manifest = _manifest(tiny_models, name)
    expected = next(
        (v for v in ("int8", "fused") if manifest["variants"][v]["serve_by_default"]), "reference"
    )
    model = load_model(tiny_models / name, RuntimeOptions(device="cpu"))
    assert model.variant.name == expected
    assert model.graphs[next(iter(model.graphs))].path.name == manifest_file(manifest, expected)


def manifest_file(manifest: dict[str, Any], variant: str) -> str:
    graph = next(iter(manifest["graphs"]))
    return (
        manifest["graphs"][graph]["file"]
        if variant == "reference"
        else manifest["variants"][variant]["graphs"][graph]
    )


def test_int8_is_evaluated_and_judged_by_accuracy_where_it_is_fast_enough(
    tiny_models: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny models' int8 is slower than fused (their matmuls are too small to pay): with the margin
    at 0, the export evaluates int8 and the accuracy rule alone decides, as on a CPU where it pays."""
    import shutil

    import model_export.variants as variants

    shutil.copytree(tiny_models / "bert-classifier", tmp_path / "bert-classifier")
    monkeypatch.setattr(variants, "SPEED_MARGIN", 0.0)
    built = variants.build_variants(tmp_path, "bert-classifier", data_dir, limit=64)
    int8, fused = built["int8"], built["fused"]
    assert int8["speed_over_fused"] > 0 and int8["validation"]["examples"] == 64
    # Fused gets its own validation pass only where it is what CPU serves (int8 refused)
    if int8["serve_by_default"]:
        assert fused["validation"] is None and fused["serve_by_default"]
    else:
        assert fused["validation"]["examples"] == 64
    metric, tolerance, _ = RULES["text-classification"]
    assert int8["serve_by_default"] == (-int8["delta"][metric] <= tolerance + 1e-9)
    assert "x the fused graphs' speed on" in int8["reason"]
    model = load_model(tmp_path / "bert-classifier", RuntimeOptions(device="cpu"))
    assert model.variant.name == ("int8" if int8["serve_by_default"] else "fused")


def test_int8_answers_a_text_in_a_batch_as_it_answers_it_alone(tiny_models: Path) -> None:
    """The contract int8 now keeps: padded into a batch of others, a text gets its own answer."""
    model = load_model(tiny_models / "bert-classifier", RuntimeOptions(device="cpu", variant="int8"))
    assert model.variant.name == "int8"
    classifier = TextClassifier(model, BatchPolicy(32, 8192, 0.0, 256, 30.0))
    texts = ["a gorgeous, witty, seductive movie.", "slow", "dull " * 40, "it's a charming journey."]
    ids = [e.ids for e in classifier.encode(texts)]
    together = np.stack(classifier.run_batch(ids))
    alone = np.stack([classifier.run_batch([i])[0] for i in ids])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-5)
