"""Which copy of a model's graphs the service serves (service.engine.variants), on real tiny manifests.

The export's variants stage and its accuracy rule are tested in test_variants.py; here: given what a
manifest records, the choice per device and MODEL_VARIANT, and that a manifest cannot name a variant
whose graphs or files do not match the reference's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.engine.manifest import Manifest
from service.engine.variants import choose_variant


def _variant(graphs: dict[str, str], precision: str, devices: list[str], passed: bool) -> dict[str, Any]:
    return {
        "graphs": graphs,
        "precision": precision,
        "fused": True,
        "devices": devices,
        "method": "test record",
        "metric": "accuracy",
        "validation": {"accuracy": 0.8},
        "delta": {"accuracy": -0.002 if passed else -0.05},
        "tolerance": 0.01,
        "serve_by_default": passed,
        "reason": "within 0.01" if passed else "accuracy dropped 0.05 > 0.01",
    }


def _manifest(tiny_models: Path, variants: dict[str, dict[str, Any]]) -> Manifest:
    raw = json.loads((tiny_models / "bert-classifier" / "manifest.json").read_text())
    raw["variants"] = variants
    for v in variants.values():
        for file in v["graphs"].values():
            raw["files"].setdefault(file, {"sha256": "0" * 64, "bytes": 1})
    return Manifest.model_validate(raw)


def test_auto_serves_the_fastest_variant_that_passed_on_each_device(tiny_models: Path) -> None:
    m = _manifest(
        tiny_models,
        {
            "fused": _variant({"model": "model.fused.onnx"}, "fp32", ["cpu", "cuda"], True),
            "int8": _variant({"model": "model.int8.onnx"}, "int8", ["cpu"], True),
            "fp16": _variant({"model": "model.fp16.onnx"}, "fp16", ["cuda"], True),
        },
    )
    cpu, cuda = choose_variant(m, "cpu"), choose_variant(m, "cuda")
    assert (cpu.name, cpu.precision, cpu.files) == ("int8", "int8", {"model": "model.int8.onnx"})
    assert (cuda.name, cuda.precision, cuda.files) == ("fp16", "fp16", {"model": "model.fp16.onnx"})


def test_a_variant_that_failed_the_rule_is_passed_over(tiny_models: Path) -> None:
    m = _manifest(
        tiny_models,
        {
            "fused": _variant({"model": "model.fused.onnx"}, "fp32", ["cpu", "cuda"], True),
            "int8": _variant({"model": "model.int8.onnx"}, "int8", ["cpu"], False),
        },
    )
    assert choose_variant(m, "cpu").name == "fused"
    no_fused = _manifest(
        tiny_models, {"int8": _variant({"model": "model.int8.onnx"}, "int8", ["cpu"], False)}
    )
    chosen = choose_variant(no_fused, "cpu")
    assert (chosen.name, chosen.precision, chosen.files) == ("reference", "fp32", {"model": "model.onnx"})
    assert "0.05" in chosen.reason  # says why int8 is not served


def test_model_variant_overrides_the_rule_but_not_the_device(tiny_models: Path) -> None:
    m = _manifest(
        tiny_models,
        {
            "int8": _variant({"model": "model.int8.onnx"}, "int8", ["cpu"], False),
            "fp16": _variant({"model": "model.fp16.onnx"}, "fp16", ["cuda"], True),
        },
    )
    assert choose_variant(m, "cpu", "int8").name == "int8"  # the operator asked, the rule is advice
    assert choose_variant(m, "cpu", "fp16").name == "reference"  # fp16 does not run on this CPU path
    assert choose_variant(m, "cpu", "fused").name == "reference"  # the model has none
    assert choose_variant(m, "cuda", "reference").name == "reference"


def test_a_model_without_variants_serves_its_reference(tiny_models: Path) -> None:
    m = _manifest(tiny_models, {})
    assert choose_variant(m, "cpu").name == choose_variant(m, "cuda").name == "reference"


@pytest.mark.parametrize(
    ("name", "graphs", "error"),
    [
        ("int4", {"model": "model.int4.onnx"}, "unknown variant"),
        ("int8", {"encoder": "x.onnx"}, "has graphs"),
    ],
)
def test_a_manifest_cannot_name_a_variant_that_does_not_match(
    tiny_models: Path, name: str, graphs: dict[str, str], error: str
) -> None:
    with pytest.raises(ValidationError, match=error):
        _manifest(tiny_models, {name: _variant(graphs, "int8", ["cpu"], True)})


def test_variant_files_must_be_listed_and_hashed(tiny_models: Path) -> None:
    raw = json.loads((tiny_models / "bert-classifier" / "manifest.json").read_text())
    raw["variants"] = {"int8": _variant({"model": "model.unlisted.onnx"}, "int8", ["cpu"], True)}
    with pytest.raises(ValidationError, match="not in the manifest's files"):
        Manifest.model_validate(raw)
