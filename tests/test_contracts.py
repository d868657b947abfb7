"""Each task's contract, declared once beside its pipeline, is what the tensor doors and the core read.

No model build: the contracts are class attributes, and the v2 signature and outputs are made from a
stand-in of a served model carrying one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from service.api.oip.metadata import model_metadata
from service.api.oip.tasks import core_parameters, outputs_of, signature
from service.errors import InvalidInputError
from service.inference.params import sampling_params
from service.inference.service import _BY_TASK
from service.models.registry import PREFERRED_DEFAULTS
from service.pipelines.contract import RANGES, Range
from service.pipelines.factory import PIPELINES
from service.pipelines.results import Classification, Embedding, LabelScore


def served(task: str, labels: list[str] | None = None, dimensions: int | None = None) -> Any:
    """What the doors see of a served model (``ServedModel``), for the pipeline of ``task``."""
    embedding = SimpleNamespace(dimensions=dimensions) if dimensions is not None else None
    sizes = {"labels": len(labels or [])} | ({"dimensions": dimensions} if dimensions else {})
    return SimpleNamespace(
        name=f"{task}-model",
        task=task,
        labels=labels or [],
        manifest=SimpleNamespace(labels=labels, embedding=embedding),
        contract=PIPELINES[task].contract,
        sizes=sizes,
        version="0123456789abcdef",
        versions=("0123456789abcdef",),
    )


def test_every_task_is_declared_once_and_read_everywhere() -> None:
    assert set(PIPELINES) == set(_BY_TASK), "the core calls every declared task, and only those"
    for task, pipeline in PIPELINES.items():
        contract = pipeline.contract
        assert (pipeline.task, pipeline.default_model) == (contract.task, contract.default_model)
        assert PREFERRED_DEFAULTS[task] == contract.default_model
        assert contract.inputs and contract.outputs, task
        assert all(spec.value is not None for spec in contract.outputs), task
        for parameter in contract.parameters:
            if parameter.kind in ("int", "float"):
                assert parameter.name in RANGES, f"{task}.{parameter.name} has no range"


def test_the_signature_puts_the_models_own_sizes_in_the_shapes() -> None:
    classifier = served("text-classification", labels=["negative", "positive"])
    sig = signature(classifier)
    assert [(t.name, t.datatype, t.shape) for t in sig.inputs] == [("text", "BYTES", (-1,))]
    assert [(t.name, t.shape) for t in sig.outputs] == [
        ("label", (-1,)),
        ("score", (-1,)),
        ("probabilities", (-1, 2)),
    ]
    embedder = served("feature-extraction", dimensions=48)
    assert signature(embedder).outputs[0].shape == (-1, 48)
    meta = model_metadata(embedder)
    assert meta.outputs[0].shape == [-1, 48]
    assert meta.parameters["request_parameters"]["normalize"].startswith("bool:")


def test_parameters_are_described_with_their_ranges_and_aliases() -> None:
    parameters = signature(served("text-generation")).parameters
    assert parameters["temperature"] == "float [0.0, 2.0]: 0 = greedy (default 1)"
    assert parameters["top_p"] == "float (0.0, 1.0]: 1 = off"
    assert parameters["max_new_tokens"] == "int: the same as max_tokens"
    translation = signature(served("translation")).parameters
    assert translation["beam_size"] == "int [1, 8]: 1 = greedy search (default)"
    assert translation["max_tokens"] == "int: the same as max_new_tokens"


def test_protocol_names_map_to_the_cores_and_back() -> None:
    contract = PIPELINES["text-generation"].contract
    values, names = core_parameters("gpt", contract, {"max_tokens": 5, "stop": '["a", "b"]', "cache": False})
    assert values == {"max_new_tokens": 5, "stop": ["a", "b"]}
    assert names["max_new_tokens"] == "parameters.max_tokens"
    assert names["temperature"] == "parameters.temperature"  # not given: still named for errors
    _, names = core_parameters("gpt", contract, {"max_new_tokens": 5})
    assert names["max_new_tokens"] == "parameters.max_new_tokens"  # the name the client used
    with pytest.raises(InvalidInputError, match="takes no parameter 'beam_size'") as caught:
        core_parameters("gpt", contract, {"beam_size": 2})
    assert caught.value.field == "parameters.beam_size"
    with pytest.raises(InvalidInputError, match="must be a boolean"):
        core_parameters("embedder", PIPELINES["feature-extraction"].contract, {"normalize": "yes"})


def test_the_ranges_are_the_cores() -> None:
    with pytest.raises(InvalidInputError, match=r"must be in \[0.0, 2.0\], got 3") as caught:
        sampling_params(temperature=3)
    assert caught.value.field == "temperature"
    assert str(Range(0.0, 1.0, low_open=True)) == "(0.0, 1.0]"
    assert str(RANGES["beam_size"]) == "[1, 8]"


def test_outputs_follow_the_contract_with_probabilities_in_label_order() -> None:
    model = served("text-classification", labels=["a", "b", "c"])
    results = [
        Classification("c", 0.7, [LabelScore("c", 0.7), LabelScore("a", 0.2), LabelScore("b", 0.1)]),
        Classification("a", 0.5, [LabelScore("a", 0.5), LabelScore("b", 0.5)]),  # top_k 2: c absent
    ]
    label, score, probabilities = outputs_of(model, results)
    assert (label.datatype, label.values) == ("BYTES", [b"c", b"a"])
    np.testing.assert_allclose(score.values, [0.7, 0.5])
    assert probabilities.shape == (2, 3) and probabilities.values.dtype == np.float32
    np.testing.assert_allclose(probabilities.values, [[0.2, 0.1, 0.7], [0.5, 0.5, 0.0]])
    (embedding,) = outputs_of(served("feature-extraction", dimensions=2), [Embedding([0.6, 0.8])])
    assert embedding.shape == (1, 2)
    np.testing.assert_allclose(embedding.values, [[0.6, 0.8]])
