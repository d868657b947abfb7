"""Open Inference Protocol v2 (KServe v2, what Triton speaks): another door into the same inference service.

Health, server and model metadata, ``infer`` with JSON tensors and the binary
tensor data extension, Triton's ``generate`` / ``generate_stream`` extension for
the generation and translation models, and the two read-only calls of
``tritonclient`` that suit a fixed repository (``/config``, ``/repository/index``).
Every inference goes through ``InferenceService`` (``v2_tasks.RUNNERS``): same
batchers, cache, limits, metrics. Errors are ``{"error": "..."}``
(``v2_errors``). ``docs/OPEN_INFERENCE_PROTOCOL.md`` has each model's tensors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any, cast

import msgspec
from litestar import Controller, Request, Response, get, post, route
from litestar.exceptions import NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, Operation, RequestBody, Schema
from litestar.response import ServerSentEvent, ServerSentEventMessage
from pydantic import ValidationError

from service.api.http.deps import Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.errors import MalformedBodyError
from service.api.http.guards import read_json
from service.api.http.openapi import also_answers
from service.api.http.request_id import request_id_of
from service.api.rest.envelope import cache_control
from service.api.rest.schemas.common import json_schema_of
from service.api.v2.errors import V2_ERRORS, V2_EXCEPTION_HANDLERS, v2_error_responses, v2_stream_error
from service.api.v2.schemas import (
    GenerateRequest,
    GenerateResponse,
    InferRequest,
    InferResponse,
    LiveOut,
    ModelMetadata,
    ModelReadyOut,
    ReadyOut,
    RepositoryIndexRequest,
    RepositoryModel,
    ServerMetadata,
    TensorMetadata,
)
from service.api.v2.tasks import (
    COMMON_PARAMETERS,
    RUNNERS,
    Call,
    Signature,
    TensorSpec,
    bind_inputs,
    decoding_params,
    sampling_params,
    signature,
)
from service.api.v2.tensors import Output, decompress, encode_response, read_inputs, split_body
from service.errors import InvalidInputError, ModelNotFoundError, ServiceError
from service.inference import InferenceService
from service.pipelines.base import ModelPipeline
from service.pipelines.results import Outcome

SERVER_NAME = "transformer-serving"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "generate"]
PLATFORM = "onnxruntime_onnx"
HEADER_LENGTH = "Inference-Header-Content-Length"
NO_TENSORS = "its task has no tensors on the v2 protocol"
_UNKNOWN = v2_error_responses(404, 503)  # metadata: unknown model or version; overloaded
_INDEX_ERRORS = v2_error_responses(400, 413)
_GENERATE_TASKS = ("text-generation", "translation")

MODEL = "/models/{model_name:str}"
VERSIONED = "/models/{model_name:str}/versions/{model_version:str}"


def _paths(suffix: str = "") -> list[str]:
    return [MODEL + suffix, VERSIONED + suffix]


def _server_version() -> str:
    try:
        return metadata.version(SERVER_NAME)
    except metadata.PackageNotFoundError:
        return "0"


class ModelVersionNotFoundError(ModelNotFoundError):
    """A version that is not the loaded one: 404, as Triton answers an unknown version."""

    def __init__(self, name: str, version: str, loaded: str) -> None:
        ServiceError.__init__(
            self,
            f"Request for unknown model: {name!r} version {version!r} is not found (loaded version: {loaded})",
            field="model_version",
        )


def resolve(inference: InferenceService, name: str, version: str | None) -> ModelPipeline:
    """The loaded model ``name``; with ``version``, only if that is the loaded version (the manifest's hash)."""
    pipeline = inference.registry.pipelines.get(name)
    if pipeline is None:
        raise ModelNotFoundError(name, list(inference.registry.pipelines))
    if version is not None and version != pipeline.model.version:
        raise ModelVersionNotFoundError(name, version, pipeline.model.version)
    return pipeline


def model_metadata(pipeline: ModelPipeline) -> ModelMetadata:
    sig = signature(pipeline)
    model = pipeline.model
    params: dict[str, Any] = {
        "task": model.task,
        "request_parameters": {**sig.parameters, **COMMON_PARAMETERS},
        "inputs": {t.name: t.description for t in sig.inputs},
        "outputs": {t.name: t.description for t in sig.outputs},
    }
    if model.manifest.labels:
        params["labels"] = list(model.manifest.labels)
    return ModelMetadata(
        name=model.name,
        versions=[model.version],
        platform=PLATFORM,
        inputs=[TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in sig.inputs],
        outputs=[TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in sig.outputs],
        parameters=params,
    )


def _config_tensor(spec: TensorSpec) -> dict[str, Any]:
    data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    return {"name": spec.name, "data_type": data_type, "dims": list(spec.shape)}


def _request_body(schema: dict[str, Any], description: str) -> type[Operation]:
    """An ``operation_class`` documenting a body the handler reads itself (binary tensors follow the JSON)."""

    @dataclass
    class WithBody(Operation):
        def __post_init__(self) -> None:
            self.request_body = RequestBody(
                content={"application/json": OpenAPIMediaType(schema=cast(Schema, schema))},
                description=description,
                required=True,
            )

    return WithBody


_INFER_BODY = _request_body(
    json_schema_of(InferRequest),
    "The JSON inference request; with the binary tensor extension, the JSON header is followed by the "
    "tensors' bytes and `Inference-Header-Content-Length` gives the header's length (any Content-Type)",
)
_INDEX_BODY = _request_body(json_schema_of(RepositoryIndexRequest), "Optional: {ready}")
_BINARY_OK = also_answers({"application/octet-stream": {"type": "string", "format": "binary"}})


def _flag(parameters: dict[str, Any], name: str, default: bool) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise InvalidInputError(f"parameters.{name} must be a boolean", f"parameters.{name}", "bool_type")
    return value


def _parse_infer(header: dict[str, Any]) -> InferRequest:
    try:
        return InferRequest.model_validate(header)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise InvalidInputError(
            f"{where}: {err.get('msg')}" if where else str(err.get("msg")), where or None
        ) from exc


def _requested_outputs(
    model: str, sig: Signature, body: InferRequest, binary_default: bool
) -> dict[str, bool]:
    """Output name -> whether it goes as binary data, for the outputs the request names (none: all)."""
    declared = {spec.name for spec in sig.outputs}
    wanted: dict[str, bool] = {}
    for out in body.outputs or []:
        if out.name not in declared:
            raise InvalidInputError(
                f"{model} has no output {out.name!r} (outputs: {', '.join(sorted(declared))})",
                f"outputs.{out.name}",
                "unknown_output",
            )
        wanted[out.name] = _flag(out.parameters or {}, "binary_data", binary_default)
    return wanted


def _infer_response(
    outcome: Outcome[Any], request_id: str | None, outputs: list[tuple[Output, bool]]
) -> Response[bytes]:
    """The response body; the REST envelope's ``cached`` and ``usage`` go in its ``parameters``."""
    header: dict[str, Any] = {"model_name": outcome.model, "model_version": outcome.model_version}
    if request_id is not None:
        header["id"] = request_id
    header["parameters"] = {
        "cached": outcome.cached,
        "input_tokens": outcome.usage.input_tokens,
        "output_tokens": outcome.usage.output_tokens,
    }
    content, header_length = encode_response(header, outputs)
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(header_length)}
    )


class OpenInferenceController(Controller):
    path = "/v2"
    tags = ("open inference protocol v2",)
    exception_handlers = V2_EXCEPTION_HANDLERS

    # --- server -------------------------------------------------------------------------------------

    @get("/", summary="Server metadata (name, version, extensions)")
    async def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(name=SERVER_NAME, version=_server_version(), extensions=EXTENSIONS)

    @get("/health/live", summary="The server is live (200)")
    async def live(self) -> LiveOut:
        return LiveOut(live=True)

    @get(
        "/health/ready",
        summary="Every loaded model is warmed up (200), else 503 with Retry-After",
        responses={
            503: ResponseSpec(data_container=ReadyOut, description="Not ready", generate_examples=False)
        },
    )
    async def ready(self, inference: InferenceService) -> Response[ReadyOut]:
        ready = inference.phase == "ready" and bool(inference.registry.pipelines)
        headers = {} if ready else {"Retry-After": "1"}
        return Response(ReadyOut(ready=ready), status_code=200 if ready else 503, headers=headers)

    @route("/{path:path}", http_method=["GET", "POST"], include_in_schema=False)
    async def unknown_path(self, path: str) -> None:
        """Other v2 paths (shared memory, tracing, logging, repository load/unload) are not served: 404 in
        the protocol's shape, so that tritonclient reports it as such."""
        raise NotFoundException(f"/v2{path} is not served here (see docs/OPEN_INFERENCE_PROTOCOL.md)")

    # --- models -------------------------------------------------------------------------------------

    @get(_paths(), summary="Model metadata: versions, platform, input and output tensors", responses=_UNKNOWN)
    async def model_metadata(
        self, inference: InferenceService, model_name: str, model_version: str | None = None
    ) -> ModelMetadata:
        return model_metadata(resolve(inference, model_name, model_version))

    @get(
        _paths("/ready"),
        summary="The model is loaded and the service ready (200), else 503",
        responses={**_UNKNOWN, 503: ResponseSpec(data_container=ModelReadyOut, description="Not ready")},
    )
    async def model_ready(
        self, inference: InferenceService, model_name: str, model_version: str | None = None
    ) -> Response[ModelReadyOut]:
        pipeline = resolve(inference, model_name, model_version)
        signature(pipeline)  # a model without v2 tensors is not there for a v2 client
        ready = inference.phase == "ready"
        headers = {} if ready else {"Retry-After": "1"}
        return Response(
            ModelReadyOut(name=pipeline.name, ready=ready), status_code=200 if ready else 503, headers=headers
        )

    @get(_paths("/config"), summary="A Triton-style model configuration (read-only)", responses=_UNKNOWN)
    async def model_config(
        self,
        services: Services,
        model_name: str,
        model_version: str | None = None,
    ) -> dict[str, Any]:
        """What ``tritonclient``'s ``get_model_config`` reads: platform, tensors, batching.

        ``max_batch_size`` is 0 because the batch axis is part of each tensor's ``dims`` (``-1``); the
        service batches requests itself (``dynamic_batching``), up to MAX_ITEMS items per request.
        """
        pipeline = resolve(services.inference, model_name, model_version)
        sig = signature(pipeline)
        return {
            "name": pipeline.name,
            "platform": PLATFORM,
            "backend": "onnxruntime",
            "version_policy": {"specific": {"versions": [pipeline.model.version]}},
            "max_batch_size": 0,
            "input": [_config_tensor(t) for t in sig.inputs],
            "output": [_config_tensor(t) for t in sig.outputs],
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(services.settings.max_queue_delay_ms * 1000),
                "preferred_batch_size": [services.settings.max_batch_size],
            },
            "parameters": {"max_items_per_request": {"string_value": str(services.limits.max_items)}},
        }

    @post(
        "/repository/index",
        status_code=200,
        summary="Every model folder: READY, or UNAVAILABLE with the reason it was refused",
        operation_class=_INDEX_BODY,
        responses=_INDEX_ERRORS,
    )
    async def repository_index(
        self, request: Request[Any, Any, Any], inference: InferenceService
    ) -> list[RepositoryModel]:
        """Read-only: the repository is loaded at start-up, so ``load`` / ``unload`` are not served."""
        body = await request.body()
        ready_only = False
        if body.strip():
            try:
                parsed = RepositoryIndexRequest.model_validate(msgspec.json.decode(body))
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
                raise MalformedBodyError(f"the body is not valid JSON: {exc}", "malformed_json") from exc
            except ValidationError as exc:
                raise InvalidInputError(f"ready: {exc.errors()[0]['msg']}", "ready") from exc
            ready_only = bool(parsed.ready)
        registry = inference.registry
        out = [
            RepositoryModel(name=n, version=p.model.version, state="READY")
            if p.task in RUNNERS
            else RepositoryModel(name=n, version=p.model.version, state="UNAVAILABLE", reason=NO_TENSORS)
            for n, p in registry.pipelines.items()
            if p.task in RUNNERS or not ready_only
        ]
        if not ready_only:
            out += [
                RepositoryModel(name=n, state="UNAVAILABLE", reason=r)
                for n, r in sorted(registry.refused.items())
            ]
        return out

    # --- inference ----------------------------------------------------------------------------------

    @post(
        _paths("/infer"),
        status_code=200,
        summary="Inference with JSON tensors or the binary tensor data extension",
        responses={
            **V2_ERRORS,
            200: ResponseSpec(
                data_container=InferResponse,
                description="JSON; with binary "
                "outputs, application/octet-stream: the JSON header, then the tensors' bytes "
                "(Inference-Header-Content-Length)",
                generate_examples=False,
            ),
        },
        operation_class=_INFER_BODY,
    )
    async def infer(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        model_name: str,
        model_version: str | None = None,
    ) -> Response[bytes]:
        """Tensors per model: ``GET /v2/models/{name}`` (inputs, outputs, parameters) and
        docs/OPEN_INFERENCE_PROTOCOL.md. Outputs are JSON unless ``binary_data_output`` or an output's
        ``binary_data`` asks for binary."""
        pipeline = resolve(services.inference, model_name, model_version)
        raw = decompress(
            await request.body(), request.headers.get("content-encoding"), services.limits.max_body_bytes
        )
        header, binary = split_body(raw, request.headers.get(HEADER_LENGTH))
        body = _parse_infer(header)
        sig = signature(pipeline)
        inputs = bind_inputs(pipeline.name, sig, read_inputs(body.inputs, binary))
        parameters = dict(body.parameters or {})
        binary_default = _flag(parameters, "binary_data_output", False)
        use_cache = _flag(parameters, "cache", True)
        wanted = _requested_outputs(pipeline.name, sig, body, binary_default)
        call = Call(
            services.inference,
            services.limits,
            services.settings,
            cache_control(request, use_cache),
            request_id_of(request) or "",
        )
        runner = RUNNERS[pipeline.task]
        outcome, outputs = await unless_disconnected(request, runner(pipeline, inputs, parameters, call))
        by_name = {o.name: o for o in outputs}
        selected = (  # in the order asked for; all of them, in the model's order, when none is named
            [(by_name[name], binary) for name, binary in wanted.items()]
            if wanted
            else [(o, binary_default) for o in outputs]
        )
        return _infer_response(outcome, body.id, selected)

    # --- Triton's generate extension ----------------------------------------------------------------

    def _generate_pipeline(
        self, inference: InferenceService, name: str, version: str | None
    ) -> ModelPipeline:
        pipeline = resolve(inference, name, version)
        if pipeline.task not in _GENERATE_TASKS:
            raise InvalidInputError(
                f"model {name!r} serves {pipeline.task}; generate takes a text-generation or translation model",
                "model_name",
                "task_mismatch",
            )
        return pipeline

    @staticmethod
    def _parameters(data: GenerateRequest) -> dict[str, Any]:
        """``parameters`` and every other top-level field (Triton passes those as parameters too)."""
        return {**(data.model_extra or {}), **(data.parameters or {})}

    @post(
        _paths("/generate"),
        status_code=200,
        before_request=read_json,
        responses=V2_ERRORS,
        summary="Triton's generate extension: text_input -> text_output (gpt, translator)",
    )
    async def generate(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: GenerateRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> GenerateResponse:
        """gpt: the completion of ``text_input`` (parameters as for infer: max_tokens, temperature, top_k,
        top_p, repetition_penalty, seed, stop); translator: its translation (beam_size, max_new_tokens,
        length_penalty)."""
        pipeline = self._generate_pipeline(services.inference, model_name, model_version)
        parameters = self._parameters(data)
        use_cache = _flag(parameters, "cache", True)
        cache = cache_control(request, use_cache)
        request_id = request_id_of(request) or ""
        if pipeline.task == "text-generation":
            params = sampling_params(
                pipeline.name, [data.text_input], parameters, services.limits, services.settings, "text_input"
            )
            generated = await unless_disconnected(
                request,
                services.inference.generate(
                    [data.text_input], params, pipeline.name, "text_input", ["text_input"], request_id, cache
                ),
            )
            outcome: Outcome[Any] = generated
            text, finish = generated.results[0].text, generated.results[0].finish_reason
        else:
            decoding = decoding_params(
                pipeline.name, [data.text_input], parameters, services.limits, "text_input"
            )
            translated = await unless_disconnected(
                request,
                services.inference.translate([data.text_input], decoding, pipeline.name, "text_input", cache),
            )
            outcome = translated
            best = translated.results[0].sequences[0]
            text, finish = best.text, best.finish_reason
        return GenerateResponse(
            id=data.id,
            model_name=outcome.model,
            model_version=outcome.model_version,
            text_output=text,
            finish_reason=finish,
        )

    @post(
        _paths("/generate_stream"),
        status_code=200,
        before_request=read_json,
        responses=V2_ERRORS,
        media_type="text/event-stream",
        summary="Triton's generate extension, streamed: one `data: {text_output}` chunk per token",
    )
    async def generate_stream(
        self,
        services: Services,
        request: Request[Any, Any, Any],
        data: GenerateRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> ServerSentEvent:
        """Server-Sent Events, ``data: {...}`` only (as Triton sends them): gpt sends one chunk per token
        (``text_output`` is the text that token adds), then a last chunk with ``text_output: ""`` and
        ``finish_reason``; the translator sends one chunk with the whole translation. An error after the
        first chunk arrives as ``data: {"error": "..."}``; errors before it are ordinary HTTP errors."""
        pipeline = self._generate_pipeline(services.inference, model_name, model_version)
        parameters = self._parameters(data)
        use_cache = _flag(parameters, "cache", True)
        request_id = request_id_of(request) or ""
        base: dict[str, Any] = {"model_name": pipeline.name, "model_version": pipeline.model.version}
        if data.id is not None:
            base = {"id": data.id, **base}
        if pipeline.task == "translation":
            decoding = decoding_params(
                pipeline.name, [data.text_input], parameters, services.limits, "text_input"
            )
            translated = await unless_disconnected(
                request,
                services.inference.translate(
                    [data.text_input],
                    decoding,
                    pipeline.name,
                    "text_input",
                    cache_control(request, use_cache),
                ),
            )
            best = translated.results[0].sequences[0]
            chunk = {**base, "text_output": best.text, "finish_reason": best.finish_reason}
            return ServerSentEvent(_single(chunk))
        params = sampling_params(
            pipeline.name, [data.text_input], parameters, services.limits, services.settings, "text_input"
        )
        _, opened = await services.inference.open_stream(
            data.text_input, params, pipeline.name, "text_input", request_id
        )
        return ServerSentEvent(_token_chunks(opened.stream, base, request))


async def _single(chunk: dict[str, Any]) -> AsyncIterator[ServerSentEventMessage]:
    yield ServerSentEventMessage(data=msgspec.json.encode(chunk).decode())


async def _token_chunks(
    stream: Any, base: dict[str, Any], request: Request[Any, Any, Any]
) -> AsyncIterator[ServerSentEventMessage]:
    finished = False
    try:
        async for event in stream:
            yield ServerSentEventMessage(
                data=msgspec.json.encode({**base, "text_output": event.text}).decode()
            )
        result = await stream.result()
        finished = True
        last = {**base, "text_output": "", "finish_reason": result.finish_reason}
        yield ServerSentEventMessage(data=msgspec.json.encode(last).decode())
    except Exception as exc:  # headers are sent: the failure can only be reported in-band
        finished = True
        yield ServerSentEventMessage(data=msgspec.json.encode(v2_stream_error(exc, request)).decode())
    finally:
        if not finished:  # the client went away: stop decoding this sequence
            stream.cancel()
