"""Each task's tensors on the Open Inference Protocol, read from its contract, and how they become one
inference-core call.

Task-level tensors, as KServe's Hugging Face runtime and Triton ensembles with
a tokenizer step expose them: text in as ``BYTES``, results out as labels
(``BYTES``), scores (``FP32``), offsets (``INT64``) and JSON strings where a flat
tensor cannot hold the item (entity lists). The first axis is the batch:
inputs are ``[-1]`` (``[-1, 1]`` is accepted too), one element per item.

Every name, datatype, shape and parameter comes from the task's contract
(``ServedModel.contract``, declared beside its pipeline); nothing here names a
task. Inference goes through ``InferenceService.infer``, so the batchers,
response cache, limits, parameter ranges and metrics are those of every other
door; this module maps tensors and parameters to the core's types and the
core's parameter names back to the protocol's (``text[2]``,
``parameters.temperature``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from service.api.http.client_json import parse_client_json
from service.api.http.fields import FieldNames
from service.api.oip.tensors import NUMERIC, Output, Tensor
from service.errors import InvalidInputError, MalformedBodyError, ModelNotFoundError, ServiceError
from service.inference import (
    CacheControl,
    InferenceService,
    Outcome,
    ServedModel,
    TaskContract,
    TensorSpec,
    image_bytes,
)
from service.inference.scheduling import priority_of_triton, timeout_of
from service.metadata import RequestMeta

# Request parameters every model takes: the binary extension's, the response cache's, and Triton's
# scheduling hints that a dynamic batcher without priorities accepts and ignores.
COMMON_PARAMETERS = {
    "binary_data_output": "bool: every output as binary data, unless an output says otherwise",
    "cache": "bool: false skips the response-cache look-up (the fresh result is still stored)",
    "priority": "int: Triton's priority level: 0 the default (normal), 1 high, 2 normal, 3 and above low",
    "timeout": "int: microseconds until this request's deadline: work still waiting then is never "
    "computed (504); a generation running then ends (finish_reason deadline)",
}


class NotOnV2Error(ModelNotFoundError):
    """A loaded model whose task declares no tensors: to a v2 client it is not there (404)."""

    def __init__(self, name: str, task: str) -> None:
        ServiceError.__init__(
            self, f"model {name!r} serves {task}, which has no tensors on the v2 protocol", field="model_name"
        )


@dataclass(frozen=True)
class Call:
    """What one infer request needs besides its tensors."""

    core: InferenceService
    cache: CacheControl
    request_id: str
    meta: RequestMeta  # its key, and its scheduling refined by its parameters (``scheduling_of``)


@dataclass(frozen=True)
class Signature:
    """A model's tensors, with its own sizes in their shapes, and its parameters (name -> what it does)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: dict[str, str] = field(default_factory=dict)


def signature(model: ServedModel) -> Signature:
    """The tensors and parameters of ``model``'s task (``docs/OPEN_INFERENCE_PROTOCOL.md``)."""
    contract = model.contract
    if not contract.inputs or not contract.outputs:
        raise NotOnV2Error(model.name, model.task)
    sizes = model.sizes
    parameters: dict[str, str] = {}
    for p in contract.parameters:
        first, *aliases = p.names
        parameters[first] = p.describe()
        parameters.update({alias: f"{p.kind}: the same as {first}" for alias in aliases})
    return Signature(
        tuple(replace(spec, shape=spec.resolved(sizes)) for spec in contract.inputs),
        tuple(replace(spec, shape=spec.resolved(sizes)) for spec in contract.outputs),
        parameters,
    )


# --- parameters: the protocol's names -> the core's -----------------------------------------------


def scheduling_of(meta: RequestMeta, parameters: Mapping[str, Any]) -> RequestMeta:
    """The request's metadata with its ``priority`` (Triton's levels) and ``timeout`` (µs), for the core's
    queues."""
    priority = parameters.get("priority")
    timeout = parameters.get("timeout")
    return meta.with_body(
        None if priority is None else priority_of_triton(priority, "parameters.priority"),
        None if timeout is None else timeout_of(timeout, "parameters.timeout", 1e-6),
    )


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
    model: str, contract: TaskContract, parameters: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The request's parameters -> (the core's parameters, the core's name -> the protocol's, for errors)."""
    check_parameters(model, parameters, {name: "" for p in contract.parameters for name in p.names})
    values: dict[str, Any] = {}
    names = {p.name: f"parameters.{p.names[0]}" for p in contract.parameters}
    for name, value in parameters.items():
        declared = contract.parameter(name)
        if declared is None:  # one of COMMON_PARAMETERS
            continue
        if declared.kind == "strings" and isinstance(value, str):
            value = _stop_strings(value)
        elif declared.kind == "bool":
            value = flag(parameters, name, False)
        values[declared.name] = value
        names[declared.name] = f"parameters.{name}"
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


def _decoded(contract: TaskContract, tensor: Tensor, max_image_bytes: int) -> list[Any]:
    if contract.decode == "image":
        return [
            image_bytes(f"{tensor.name}[{i}]", bytes(raw), max_image_bytes)
            for i, raw in enumerate(tensor.values)
        ]
    return texts_of(tensor)


# --- results -> tensors ---------------------------------------------------------------------------


def outputs_of(model: ServedModel, results: Sequence[Any]) -> list[Output]:
    """Each declared output over the results, in the contract's order: a ``labels`` axis in label order."""
    n = len(results)
    outputs = []
    for spec, shape in zip(model.contract.outputs, signature(model).outputs, strict=True):
        assert spec.value is not None, f"output {spec.name} of {model.task} says no value"
        values = [spec.value(r) for r in results]
        if spec.datatype == "BYTES":
            outputs.append(Output(spec.name, "BYTES", (n,), [v.encode("utf-8") for v in values]))
            continue
        if "labels" in spec.shape:
            values = [[row.get(label, 0.0) for label in model.labels] for row in values]
        dims = (n, *(int(d) for d in shape.shape[1:]))
        outputs.append(
            Output(spec.name, spec.datatype, dims, np.asarray(values, NUMERIC[spec.datatype]).reshape(dims))
        )
    return outputs


async def run(
    model: ServedModel, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any], call: Call
) -> tuple[Outcome[Any], list[Output]]:
    """The model's task over the bound ``inputs``: one call to the core, its results as the declared outputs."""
    contract = model.contract
    columns = {
        spec.name: _decoded(contract, inputs[spec.name], call.core.limits.max_image_bytes)
        for spec in contract.inputs
    }
    values, names = core_parameters(model.name, contract, parameters)
    contexts = contract.inputs[1].name if len(contract.inputs) > 1 else None
    with field_names(contract.inputs[0].name, names, contexts):
        outcome = await call.core.infer(call.meta, model.ref, columns, values, call.cache, call.request_id)
    return outcome, outputs_of(model, outcome.results)
