"""One v2 ``infer``, whatever carries it: the HTTP route (JSON or binary tensors) and the gRPC
``ModelInfer`` both decode their request into an ``InferCall`` and render what ``infer`` returns.

Here: the model (and version), the tensors bound to its signature, the protocol's own parameters
(``binary_data_output``, ``cache``), the outputs asked for, and ``tasks.run``, which maps the tensors
to one inference-core call by the task's contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.api.oip.tasks import Call, Signature, bind_inputs, flag, run, scheduling_of, signature
from service.api.oip.tensors import Output, Tensor
from service.errors import InvalidInputError
from service.inference import CacheControl, InferenceService, Outcome
from service.metadata import RequestMeta


@dataclass(frozen=True)
class InferCall:
    """A decoded infer request: ``outputs`` names the outputs asked for, each with its parameters
    (none: every output, in the model's order)."""

    model_name: str
    model_version: str | None
    tensors: Sequence[Tensor]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    outputs: Sequence[tuple[str, Mapping[str, Any]]] = ()
    use_cache_header: str | None = None  # HTTP's Cache-Control; None elsewhere
    request_id: str = ""
    cache_scope: str = ""  # the caller's response-cache scope (CACHE_SCOPE)


@dataclass(frozen=True)
class InferResult:
    outcome: Outcome[Any]
    outputs: list[tuple[Output, bool]]  # each output, and whether it goes as binary data


def _requested(
    model: str, sig: Signature, outputs: Sequence[tuple[str, Mapping[str, Any]]], binary: bool
) -> dict[str, bool]:
    """Output name -> whether it goes as binary data, for the outputs the request names."""
    declared = {spec.name for spec in sig.outputs}
    wanted: dict[str, bool] = {}
    for name, parameters in outputs:
        if name not in declared:
            raise InvalidInputError(
                f"{model} has no output {name!r} (outputs: {', '.join(sorted(declared))})",
                f"outputs.{name}",
                "unknown_output",
            )
        wanted[name] = flag(parameters, "binary_data", binary)
    return wanted


async def infer(core: InferenceService, call: InferCall, meta: RequestMeta) -> InferResult:
    model = await core.served(meta, call.model_name, version=call.model_version)
    sig = signature(model)
    inputs = bind_inputs(model.name, sig, call.tensors)
    parameters = dict(call.parameters)
    binary_default = flag(parameters, "binary_data_output", False)
    use_cache = flag(parameters, "cache", True)
    wanted = _requested(model.name, sig, call.outputs, binary_default)
    cache = CacheControl.of(use_cache, call.use_cache_header, call.cache_scope)
    scheduled = scheduling_of(meta, parameters)
    outcome, outputs = await run(model, inputs, parameters, Call(core, cache, call.request_id, scheduled))
    by_name = {o.name: o for o in outputs}
    selected = (  # in the order asked for; all of them, in the model's order, when none is named
        [(by_name[name], binary) for name, binary in wanted.items()]
        if wanted
        else [(o, binary_default) for o in outputs]
    )
    return InferResult(outcome, selected)
