"""Each task's tensors on the Open Inference Protocol v2, and how they become an ``InferenceService`` call.

Task-level tensors, as KServe's Hugging Face runtime and Triton ensembles with
a tokenizer step expose them: text in as ``BYTES``, results out as labels
(``BYTES``), scores (``FP32``), offsets (``INT64``) and JSON strings where a flat
tensor cannot hold the item (entity lists). The first axis is the batch:
inputs are ``[-1]`` (``[-1, 1]`` is accepted too), one element per item.

Nothing runs here but the inference core's own methods, so the batchers,
response cache, limits, parameter ranges and metrics are those of every other
door; this module only maps tensors and parameters to the core's types and the
core's parameter names back to the protocol's (``text[2]``,
``parameters.temperature``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from service.api.http.client_json import parse_client_json
from service.api.http.fields import FieldNames
from service.api.v2.tensors import Output, Tensor
from service.errors import InvalidInputError, MalformedBodyError, ModelNotFoundError, ServiceError
from service.inference import CacheControl, InferenceService, Outcome, ServedModel, image_bytes
from service.inference.params import decoding_params, sampling_params

# Request parameters every model takes: the binary extension's, the response cache's, and Triton's
# scheduling hints that a dynamic batcher without priorities accepts and ignores.
COMMON_PARAMETERS = {
    "binary_data_output": "bool: every output as binary data, unless an output says otherwise",
    "cache": "bool: false skips the response-cache look-up (the fresh result is still stored)",
    "priority": "accepted and ignored (one queue per model)",
    "timeout": "accepted and ignored (the queue has its own deadline)",
}


class NotOnV2Error(ModelNotFoundError):
    """A loaded model whose task has no tensors here: to a v2 client it is not there (404)."""

    def __init__(self, name: str, task: str) -> None:
        ServiceError.__init__(
            self, f"model {name!r} serves {task}, which has no tensors on the v2 protocol", field="model_name"
        )


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    description: str


@dataclass(frozen=True)
class Call:
    """What one infer request needs besides its tensors."""

    core: InferenceService
    cache: CacheControl
    request_id: str


Runner = Callable[
    [ServedModel, Mapping[str, Tensor], Mapping[str, Any], Call],
    Awaitable[tuple[Outcome[Any], list[Output]]],
]


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: dict[str, str] = field(default_factory=dict)  # name -> what it does


def _item(name: str, datatype: str, description: str) -> TensorSpec:
    return TensorSpec(name, datatype, (-1,), description)


def signature(model: ServedModel) -> Signature:
    """The tensors and parameters of ``model``'s task (``docs/OPEN_INFERENCE_PROTOCOL.md``)."""
    task = model.task
    labels = model.labels
    classification = (
        _item("label", "BYTES", "the most probable label"),
        _item("score", "FP32", "its probability"),
        TensorSpec(
            "probabilities", "FP32", (-1, len(labels)), "every label's probability, in the order of `labels`"
        ),
    )
    if task == "text-classification":
        return Signature((_item("text", "BYTES", "UTF-8 text"),), classification)
    if task == "image-classification":
        image = _item("image", "BYTES", "PNG/JPEG bytes (base64 of them in JSON, where BYTES are strings)")
        return Signature((image,), classification)
    if task == "question-answering":
        return Signature(
            (_item("question", "BYTES", "UTF-8 question"), _item("context", "BYTES", "UTF-8 context")),
            (
                _item("answer", "BYTES", "the answer span's text"),
                _item("start", "INT64", "its start: a character offset into the context"),
                _item("end", "INT64", "its end: answer == context[start:end]"),
                _item("score", "FP32", "p(start) * p(end)"),
            ),
        )
    if task == "token-classification":
        return Signature(
            (_item("text", "BYTES", "UTF-8 text"),),
            (
                _item(
                    "entities",
                    "BYTES",
                    'JSON array per item: [{"text", "label", "start", "end", "score"}], character offsets',
                ),
            ),
        )
    if task == "text-generation":
        return Signature(
            (_item("prompt", "BYTES", "UTF-8 prompt"),),
            (
                _item("text", "BYTES", "the completion, without the prompt"),
                _item("finish_reason", "BYTES", "length | stop | eos"),
            ),
            {name: desc for name, (_, desc) in GENERATION_PARAMETERS.items()},
        )
    if task == "translation":
        return Signature(
            (_item("text", "BYTES", "UTF-8 English text"),),
            (
                _item("translation", "BYTES", "the German translation (best hypothesis)"),
                _item("finish_reason", "BYTES", "eos | length"),
                _item(
                    "score", "FP32", "length-penalised log-probability (beam) or mean token log-probability"
                ),
            ),
            {name: desc for name, (_, desc) in TRANSLATION_PARAMETERS.items()},
        )
    if task == "feature-extraction":
        assert model.manifest.embedding is not None, "a feature-extraction model has an embedding section"
        dimensions = model.manifest.embedding.dimensions
        return Signature(
            (_item("text", "BYTES", "UTF-8 text"),),
            (
                TensorSpec(
                    "embedding", "FP32", (-1, dimensions), "the sentence embedding (unit length by default)"
                ),
            ),
            {name: desc for name, (_, desc) in EMBEDDING_PARAMETERS.items()},
        )
    raise NotOnV2Error(model.name, task)  # a new task says its tensors here, and its runner in RUNNERS


# --- parameters: v2 names -> the core's -----------------------------------------------------------

# v2 parameter -> (the core's parameter, description); aliases name the same parameter.
GENERATION_PARAMETERS: dict[str, tuple[str, str]] = {
    "max_tokens": ("max_new_tokens", "int: tokens to generate (default 64, at most MAX_NEW_TOKENS)"),
    "max_new_tokens": ("max_new_tokens", "int: the same as max_tokens"),
    "temperature": ("temperature", "float 0..2: 0 = greedy (default 1)"),
    "top_k": ("top_k", "int: 0 = off"),
    "top_p": ("top_p", "float (0, 1]: 1 = off"),
    "repetition_penalty": ("repetition_penalty", "float: 1 = off"),
    "seed": ("seed", "int: reproducible sampling"),
    "stop": ("stop", "string, or a JSON array of strings: generation ends before the first"),
}
TRANSLATION_PARAMETERS: dict[str, tuple[str, str]] = {
    "beam_size": ("beam_size", "int 1..8: 1 = greedy search (default)"),
    "max_new_tokens": ("max_new_tokens", "int: at most MAX_NEW_TOKENS; default from the source length"),
    "max_tokens": ("max_new_tokens", "int: the same as max_new_tokens"),
    "length_penalty": ("length_penalty", "float 0..5: beam score = log-prob / length ** length_penalty"),
}

EMBEDDING_PARAMETERS: dict[str, tuple[str, str]] = {
    "normalize": ("normalize", "bool: false gives the mean-pooled vector, not normalised (default true)"),
}


def flag(parameters: Mapping[str, Any], name: str, default: bool) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise InvalidInputError(f"parameters.{name} must be a boolean", f"parameters.{name}", "bool_type")
    return value


def check_parameters(model: str, parameters: Mapping[str, Any], own: Mapping[str, str]) -> None:
    """A misspelt parameter must not silently fall back to its default (as on the REST routes)."""
    for name in parameters:
        if name not in own and name not in COMMON_PARAMETERS:
            known = ", ".join(sorted({*own, *COMMON_PARAMETERS}))
            raise InvalidInputError(
                f"{model} takes no parameter {name!r} (it takes: {known})",
                f"parameters.{name}",
                "unknown_parameter",
            )


def core_parameters(
    model: str, parameters: Mapping[str, Any], table: Mapping[str, tuple[str, str]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """v2 parameters -> (the core's parameters, the core's name -> the v2 parameter's, for errors)."""
    check_parameters(model, parameters, {k: v[1] for k, v in table.items()})
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, value in parameters.items():
        if name in table:
            target = table[name][0]
            if name == "stop" and isinstance(value, str):
                value = _stop_strings(value)
            values[target] = value
            names[target] = f"parameters.{name}"
    names.setdefault(
        "max_new_tokens",
        "parameters.max_tokens" if table is GENERATION_PARAMETERS else "parameters.max_new_tokens",
    )
    return values, names


def _stop_strings(value: str) -> Any:
    """A ``stop`` string holding a JSON list is that list; any other string (JSON or not) is one stop string."""
    if value.startswith("["):
        try:
            return parse_client_json(value)
        except MalformedBodyError:
            pass
    return [value]


def field_names(
    inputs: str, names: Mapping[str, str] | None = None, contexts: str | None = None
) -> FieldNames:
    """The core's names as this protocol's: items are ``<input tensor>[i]``, parameters ``parameters.x``."""
    indexed = {"inputs": f"{inputs}[{{i}}]"}
    if contexts is not None:
        indexed["contexts"] = f"{contexts}[{{i}}]"
    return FieldNames(indexed, {"inputs": inputs, **(names or {})})


# --- tensors -> Python values ---------------------------------------------------------------------


def bind_inputs(model: str, sig: Signature, tensors: Sequence[Tensor]) -> dict[str, Tensor]:
    """The request's tensors by name, each the declared datatype, batch-shaped, all of one batch size."""
    expected = {spec.name: spec for spec in sig.inputs}
    bound: dict[str, Tensor] = {}
    for tensor in tensors:
        spec = expected.get(tensor.name)
        if spec is None:
            raise InvalidInputError(
                f"{model} has no input {tensor.name!r} (inputs: {', '.join(expected)})",
                tensor.name,
                "unknown_input",
            )
        if tensor.name in bound:
            raise InvalidInputError(f"input {tensor.name!r} is given twice", tensor.name, "duplicate_input")
        if tensor.datatype != spec.datatype:
            raise InvalidInputError(
                f"input {tensor.name!r} is {tensor.datatype}; {model} takes {spec.datatype}",
                tensor.name,
                "wrong_datatype",
            )
        if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
            raise InvalidInputError(
                f"input {tensor.name!r} has shape {list(tensor.shape)}; expected [-1] or [-1, 1] (one element per item)",
                tensor.name,
                "wrong_shape",
            )
        if tensor.shape[0] == 0:
            raise InvalidInputError(
                f"input {tensor.name!r} is empty: give at least one item", tensor.name, "empty"
            )
        bound[tensor.name] = tensor
    for name in expected:
        if name not in bound:
            raise InvalidInputError(f"{model} needs input {name!r}", name, "missing_input")
    sizes = {name: len(t) for name, t in bound.items()}
    if len(set(sizes.values())) > 1:
        raise InvalidInputError(
            f"inputs have different batch sizes: {sizes}", next(iter(sizes)), "batch_mismatch"
        )
    return bound


def texts_of(tensor: Tensor) -> list[str]:
    out = []
    for i, raw in enumerate(tensor.values):
        try:
            out.append(bytes(raw).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"not valid UTF-8 at byte {exc.start} ({exc.reason})", f"{tensor.name}[{i}]", "invalid_utf8"
            ) from exc
    return out


def _bytes(values: Sequence[str]) -> list[bytes]:
    return [v.encode("utf-8") for v in values]


def _probabilities(results: Sequence[Any], labels: Sequence[str]) -> np.ndarray:
    index = {label: i for i, label in enumerate(labels)}
    probs = np.zeros((len(results), len(labels)), dtype=np.float32)
    for row, result in enumerate(results):
        for top in result.top:
            probs[row, index[top.label]] = top.score
    return probs


# --- one runner per task --------------------------------------------------------------------------


async def _classify_texts(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    check_parameters(model.name, parameters, {})
    texts = texts_of(inputs["text"])
    with field_names("text"):
        outcome = await call.core.classify_texts(texts, None, model.name, call.cache)
    return outcome, _classification_outputs(outcome, model.labels)


async def _classify_images(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    check_parameters(model.name, parameters, {})
    tensor = inputs["image"]
    max_bytes = call.core.limits.max_image_bytes
    images = [image_bytes(f"image[{i}]", bytes(raw), max_bytes) for i, raw in enumerate(tensor.values)]
    with field_names("image"):
        outcome = await call.core.classify_images(images, None, model.name, call.cache)
    return outcome, _classification_outputs(outcome, model.labels)


def _classification_outputs(outcome: Outcome[Any], labels: Sequence[str]) -> list[Output]:
    n = len(outcome.results)
    return [
        Output("label", "BYTES", (n,), _bytes([c.label for c in outcome.results])),
        Output("score", "FP32", (n,), np.array([c.score for c in outcome.results], dtype=np.float32)),
        Output("probabilities", "FP32", (n, len(labels)), _probabilities(outcome.results, labels)),
    ]


async def _answer(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    check_parameters(model.name, parameters, {})
    questions, contexts = texts_of(inputs["question"]), texts_of(inputs["context"])
    with field_names("question", contexts="context"):
        outcome = await call.core.answer(list(zip(questions, contexts, strict=True)), model.name, call.cache)
    n = len(outcome.results)
    return outcome, [
        Output("answer", "BYTES", (n,), _bytes([a.answer for a in outcome.results])),
        Output("start", "INT64", (n,), np.array([a.start for a in outcome.results], dtype=np.int64)),
        Output("end", "INT64", (n,), np.array([a.end for a in outcome.results], dtype=np.int64)),
        Output("score", "FP32", (n,), np.array([a.score for a in outcome.results], dtype=np.float32)),
    ]


async def _entities(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    check_parameters(model.name, parameters, {})
    texts = texts_of(inputs["text"])
    with field_names("text"):
        outcome = await call.core.entities(texts, model.name, call.cache)
    rows = [json.dumps([asdict(e) for e in r.entities], ensure_ascii=False) for r in outcome.results]
    return outcome, [Output("entities", "BYTES", (len(rows),), _bytes(rows))]


async def _generate(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    prompts = texts_of(inputs["prompt"])
    values, names = core_parameters(model.name, parameters, GENERATION_PARAMETERS)
    with field_names("prompt", names):
        params = sampling_params(**values)
        outcome = await call.core.generate(prompts, params, model.name, call.cache, call.request_id)
    n = len(outcome.results)
    return outcome, [
        Output("text", "BYTES", (n,), _bytes([g.text for g in outcome.results])),
        Output("finish_reason", "BYTES", (n,), _bytes([g.finish_reason for g in outcome.results])),
    ]


async def _translate(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    texts = texts_of(inputs["text"])
    values, names = core_parameters(model.name, parameters, TRANSLATION_PARAMETERS)
    with field_names("text", names):
        params = decoding_params(**values)
        outcome = await call.core.translate(texts, params, model.name, call.cache)
    best = [t.sequences[0] for t in outcome.results]
    n = len(best)
    return outcome, [
        Output("translation", "BYTES", (n,), _bytes([s.text for s in best])),
        Output("finish_reason", "BYTES", (n,), _bytes([s.finish_reason for s in best])),
        Output("score", "FP32", (n,), np.array([s.score for s in best], dtype=np.float32)),
    ]


async def _embed(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    texts = texts_of(inputs["text"])
    values, names = core_parameters(model.name, parameters, EMBEDDING_PARAMETERS)
    normalize = values.get("normalize", True)
    if not isinstance(normalize, bool):
        raise InvalidInputError("must be a boolean", "parameters.normalize", "bool_type")
    with field_names("text", names):
        outcome = await call.core.embed(texts, normalize, model.name, call.cache)
    vectors = np.array([e.vector for e in outcome.results], dtype=np.float32)
    return outcome, [Output("embedding", "FP32", vectors.shape, vectors)]


RUNNERS: dict[str, Runner] = {
    "text-classification": _classify_texts,
    "image-classification": _classify_images,
    "question-answering": _answer,
    "token-classification": _entities,
    "text-generation": _generate,
    "translation": _translate,
    "feature-extraction": _embed,
}
