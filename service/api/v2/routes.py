"""Open Inference Protocol v2 (KServe v2, what Triton speaks): another door into the same inference service.

Health, server and model metadata, ``infer`` with JSON tensors and the binary
tensor data extension, Triton's ``generate`` / ``generate_stream`` extension for
the generation and translation models, and the two read-only calls of
``tritonclient`` that suit a fixed repository (``/config``, ``/repository/index``).
Every inference goes through ``InferenceService`` (``oip/tasks.py``, by the task's contract): same
batchers, cache, limits, metrics. Errors are ``{"error": "..."}``
(``v2_errors``). ``docs/OPEN_INFERENCE_PROTOCOL.md`` has each model's tensors.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post, route
from litestar.exceptions import NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from pydantic import ValidationError

from service.api.http.auth import cache_scope_of
from service.api.http.body_schema import json_schema_of
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.meta import request_meta
from service.api.http.openapi import also_answers, request_body
from service.api.http.request_id import request_id_of
from service.api.oip.infer import InferCall, infer
from service.api.oip.metadata import (
    EXTENSIONS,
    PLATFORM,
    SERVER_NAME,
    ModelMetadata,
    model_metadata,
    server_version,
)
from service.api.oip.tasks import signature
from service.api.oip.tensors import Output
from service.api.v2.errors import V2_ERRORS, V2_EXCEPTION_HANDLERS, v2_error_responses
from service.api.v2.schemas import (
    InferRequest,
    InferResponse,
    LiveOut,
    ModelReadyOut,
    ReadyOut,
    ServerMetadata,
)
from service.api.v2.tensors import decompress, encode_response, read_inputs, split_body
from service.errors import InvalidInputError
from service.inference import InferenceService, Outcome, ServedModel, TensorSpec
from service.metadata import RequestMeta

HEADER_LENGTH = "Inference-Header-Content-Length"
_UNKNOWN = v2_error_responses(404, 503)  # metadata: unknown model or version; overloaded

MODEL = "/models/{model_name:str}"
VERSIONED = "/models/{model_name:str}/versions/{model_version:str}"


def _paths(suffix: str = "") -> list[str]:
    return [MODEL + suffix, VERSIONED + suffix]


async def resolve(core: InferenceService, meta: RequestMeta, name: str, version: str | None) -> ServedModel:
    """The served model ``name`` (with a budget, loaded on demand as for infer); with ``version``, only if that
    is a loaded version (the manifest's hash)."""
    return await core.served(meta, name, version=version)


def _config_tensor(spec: TensorSpec) -> dict[str, Any]:
    data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    return {"name": spec.name, "data_type": data_type, "dims": list(spec.shape)}


_INFER_BODY = request_body(
    json_schema_of(InferRequest),
    "The JSON inference request; with the binary tensor extension, the JSON header is followed by the "
    "tensors' bytes and `Inference-Header-Content-Length` gives the header's length (any Content-Type)",
)
_BINARY_OK = also_answers({"application/octet-stream": {"type": "string", "format": "binary"}})


def _parse_infer(header: dict[str, Any]) -> InferRequest:
    try:
        return InferRequest.model_validate(header)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise InvalidInputError(
            f"{where}: {err.get('msg')}" if where else str(err.get("msg")), where or None
        ) from exc


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
        return ServerMetadata(name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS)

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
        ready = inference.ready
        headers = {} if ready else {"Retry-After": "1"}
        return Response(ReadyOut(ready=ready), status_code=200 if ready else 503, headers=headers)

    @route("/{path:path}", http_method=["GET", "POST"], include_in_schema=False)
    async def unknown_path(self, path: str) -> None:
        """Other v2 paths (shared memory, tracing, logging) are not served: 404 in the protocol's shape, so
        that tritonclient reports it as such."""
        raise NotFoundException(f"/v2{path} is not served here (see docs/OPEN_INFERENCE_PROTOCOL.md)")

    # --- models -------------------------------------------------------------------------------------

    @get(_paths(), summary="Model metadata: versions, platform, input and output tensors", responses=_UNKNOWN)
    async def model_metadata(
        self,
        inference: InferenceService,
        request: HttpRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> ModelMetadata:
        return model_metadata(await resolve(inference, request_meta(request), model_name, model_version))

    @get(
        _paths("/ready"),
        summary="The model is loaded and the service ready (200); a known model that is not resident 400 "
        "(as Triton); the service starting or draining 503",
        responses={
            **_UNKNOWN,
            400: ResponseSpec(
                data_container=ModelReadyOut, description="The model is not loaded (not ready)"
            ),
            503: ResponseSpec(data_container=ModelReadyOut, description="The service is not ready"),
        },
    )
    async def model_ready(
        self,
        inference: InferenceService,
        request: HttpRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> Response[ModelReadyOut]:
        meta = request_meta(request)
        model, ready = inference.model_ready(meta, model_name, model_version)
        if model is not None:
            signature(model)  # a model without v2 tensors is not there for a v2 client
        if model is None:  # known, not resident (unloaded, refused, or loading on its first request)
            return Response(ModelReadyOut(name=model_name, ready=False), status_code=400)  # as Triton
        headers = {} if ready else {"Retry-After": "1"}
        return Response(
            ModelReadyOut(name=model.name, ready=ready), status_code=200 if ready else 503, headers=headers
        )

    @get(_paths("/config"), summary="A Triton-style model configuration (read-only)", responses=_UNKNOWN)
    async def model_config(
        self,
        services: Services,
        request: HttpRequest,
        model_name: str,
        model_version: str | None = None,
    ) -> dict[str, Any]:
        """What ``tritonclient``'s ``get_model_config`` reads: platform, tensors, batching.

        ``max_batch_size`` is 0 because the batch axis is part of each tensor's ``dims`` (``-1``); the
        service batches requests itself (``dynamic_batching``), up to MAX_ITEMS items per request.
        """
        model = await resolve(services.inference, request_meta(request), model_name, model_version)
        sig = signature(model)
        return {
            "name": model.name,
            "platform": PLATFORM,
            "backend": "onnxruntime",
            "version_policy": {"specific": {"versions": list(model.versions)}},
            "max_batch_size": 0,
            "input": [_config_tensor(t) for t in sig.inputs],
            "output": [_config_tensor(t) for t in sig.outputs],
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(services.settings.max_queue_delay_ms * 1000),
                "preferred_batch_size": [services.settings.max_batch_size],
            },
            "parameters": {
                "max_items_per_request": {"string_value": str(services.inference.limits.max_items)}
            },
        }

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
        # an unknown model is a 404 before the body; one of the repository not resident loads in ``infer``
        meta = request_meta(request)
        services.inference.check_servable(meta, model_name, model_version)
        raw = decompress(
            await request.body(),
            request.headers.get("content-encoding"),
            services.inference.limits.max_body_bytes,
        )
        header, binary = split_body(raw, request.headers.get(HEADER_LENGTH))
        body = _parse_infer(header)
        call = InferCall(
            model_name,
            model_version,
            read_inputs(body.inputs, binary),
            body.parameters or {},
            [(out.name, out.parameters or {}) for out in body.outputs or []],
            request.headers.get("cache-control"),
            request_id_of(request) or "",
            cache_scope_of(request),
        )
        result = await unless_disconnected(request, infer(services.inference, call, meta))
        return _infer_response(result.outcome, body.id, result.outputs)
