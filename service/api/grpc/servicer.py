"""KServe's ``GRPCInferenceService`` on the inference core: health, metadata and ``ModelInfer``.

A thin adapter: each RPC decodes its message, calls what the HTTP v2 door calls
(``oip.infer.infer``, ``oip.tasks.signature``, the core's readiness and models) and
encodes the answer; limits, defaults, lookups and the task contracts are theirs. The
generated service classes come from ``tritonclient.grpc`` (Triton's
``grpc_service.proto``, a superset of KServe's ``grpc_predict_v2.proto`` in the same
``inference`` package): the RPCs it adds beyond KServe's answer ``UNIMPLEMENTED``, but for the
repository extension (``RepositoryIndex``, ``RepositoryModelLoad``, ``RepositoryModelUnload``), whose
calls the HTTP door's repository routes share (``oip/repository.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from service.access.keys import PRIORITY_SERVED, Admission, ApiKeys, ControlAccess, admit_key, presented_key
from service.access.quotas import Quotas
from service.api.grpc.auth import metadata_of
from service.api.grpc.tensors import add_output, parameters_of, read_inputs, set_parameter
from service.api.http.request_id import client_request_id
from service.api.oip import repository
from service.api.oip.infer import InferCall, infer
from service.api.oip.metadata import EXTENSIONS, PLATFORM, SERVER_NAME, model_metadata, server_version
from service.api.oip.tasks import signature
from service.context import RequestContext, bind, unbind
from service.errors import KINDS, ProblemError, problem_of
from service.inference import InferenceService
from service.inference.scheduling import NAMES
from service.lifecycle import Lifecycle
from service.metadata import RequestMeta
from service.observe import spans
from service.observe.metrics import Metrics

T = TypeVar("T")
access_log = logging.getLogger("service.access")


class InferenceServicer(rpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        core: InferenceService,
        lifecycle: Lifecycle,
        metrics: Metrics,
        keys: ApiKeys,
        log_access: bool,
        control_mode: str = "none",
        control_access: ControlAccess | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.core = core
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.keys = keys  # checked by the interceptor (auth.py); here only for the caller's cache scope
        self.log_access = log_access  # ACCESS_LOG: one line per call, as on HTTP
        self.control_mode = control_mode  # MODEL_CONTROL_MODE
        self.control_access = control_access or ControlAccess([], loopback_only=False)
        self.quotas = quotas  # API_KEYS_FILE: checked per call, as the HTTP middleware does

    async def _answer(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        request_id: str,
        work: Callable[[RequestMeta], Awaitable[T]],
    ) -> T:
        """``work(meta)``, given the call's metadata (its key, its key's class and ceiling, the call's
        deadline), counted in flight (a drain waits for it), in the gRPC metrics and the access log (id,
        RPC, status code, model, seconds: never content), its errors as gRPC statuses. API keys are
        checked before any RPC runs (``auth.py``)."""
        self.lifecycle.request_started()
        request_context = RequestContext(request_id=request_id)
        token = bind(request_context)
        in_flight = self.metrics.grpc_in_flight.labels(method)
        in_flight.inc()
        started, code = time.perf_counter(), grpc.StatusCode.OK
        remaining = context.time_remaining()  # the call's deadline, where the client set one
        admitted: Admission | None = None
        try:
            presented = presented_key(metadata_of(context.invocation_metadata()))
            entry = self.keys.identify(presented)
            meta = RequestMeta(request_id=request_id).keyed(entry, self.keys.prefix_salt(presented))
            if entry is not None:
                refused, admitted = await admit_key(entry, self.quotas)
                if refused is not None:
                    admitted = None  # not counted: nothing to give back
                    raise ProblemError(refused)
                meta = admitted.scheduled(meta)
            timeout_s = remaining if remaining is not None and remaining > 0 else None
            answer = await work(meta.scheduled(None, timeout_s))
            if admitted is not None and admitted.ceiling.lowered_from is not None:
                served = NAMES[admitted.ceiling.most_urgent]
                context.set_trailing_metadata(((PRIORITY_SERVED.lower(), served),))
            return answer
        except Exception as exc:
            problem = problem_of(exc, "gRPC")
            code = getattr(grpc.StatusCode, problem.grpc)
            if admitted is not None:
                await admitted.settle(self.quotas, KINDS[problem.kind].refunded)
            await context.abort(code, problem.text)
            raise  # abort raises; this line is never reached
        finally:
            elapsed = time.perf_counter() - started
            labels = (method, request_context.model or "-", code.name)
            self.metrics.grpc_requests.labels(*labels).inc()
            self.metrics.grpc_latency.labels(*labels).observe(elapsed, spans.exemplar())
            if self.log_access:
                access_log.info("gRPC %s %s %.3fs", method, code.name, elapsed)
            in_flight.dec()
            unbind(token)
            self.lifecycle.request_finished()

    def _cache_scope(self, context: Any) -> str:
        """The caller's response-cache scope, from the key in its metadata (as on HTTP)."""
        if not self.keys.enabled:
            return ""
        return self.keys.cache_scope(presented_key(metadata_of(context.invocation_metadata())))

    # --- health and metadata ----------------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.core.ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def ready(meta: RequestMeta) -> pb.ModelReadyResponse:
            # as Triton: a model the service knows but does not hold is ready: false, not an error
            model, ready = self.core.model_ready(meta, request.name, request.version or None)
            if model is not None:
                signature(model)  # a model without v2 tensors is not there for a v2 client
            return pb.ModelReadyResponse(ready=ready)

        return await self._answer(context, "ModelReady", client_request_id(""), ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def metadata(meta: RequestMeta) -> pb.ModelMetadataResponse:
            # with a budget, as ModelInfer: loaded on demand
            described = model_metadata(
                await self.core.served(meta, request.name, version=request.version or None)
            )
            out = pb.ModelMetadataResponse(
                name=described.name, versions=described.versions, platform=PLATFORM
            )
            for tensors, specs in ((out.inputs, described.inputs), (out.outputs, described.outputs)):
                for spec in specs:
                    tensors.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
            return out

        return await self._answer(context, "ModelMetadata", client_request_id(""), metadata)

    # --- inference --------------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        """Outputs always as ``raw_output_contents``; the REST envelope's ``cached`` and token counts go in
        the response's ``parameters``, as on HTTP."""

        request_id = client_request_id(request.id)  # for the logs; the response echoes the id as sent

        async def run(meta: RequestMeta) -> pb.ModelInferResponse:
            call = InferCall(
                request.model_name,
                request.model_version or None,
                read_inputs(request),
                parameters_of(request.parameters),
                [(out.name, parameters_of(out.parameters)) for out in request.outputs],
                request_id=request_id,
                cache_scope=self._cache_scope(context),
            )
            result = await infer(self.core, call, meta)
            outcome = result.outcome
            response = pb.ModelInferResponse(
                model_name=outcome.model, model_version=outcome.model_version, id=request.id
            )
            set_parameter(response.parameters, "cached", outcome.cached)
            set_parameter(response.parameters, "input_tokens", outcome.usage.input_tokens)
            set_parameter(response.parameters, "output_tokens", outcome.usage.output_tokens)
            for output, _ in result.outputs:
                add_output(response, output)
            return response

        return await self._answer(context, "ModelInfer", request_id, run)

    # --- the repository extension -----------------------------------------------------------------

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        async def index(meta: RequestMeta) -> pb.RepositoryIndexResponse:
            out = pb.RepositoryIndexResponse()
            for state in repository.index(self.core, meta, request.ready):
                out.models.add(
                    name=state.name, version=state.version or "", state=state.state, reason=state.reason
                )
            return out

        return await self._answer(context, "RepositoryIndex", client_request_id(""), index)

    def _control(self, context: Any) -> repository.Control:
        presented = presented_key(metadata_of(context.invocation_metadata()))
        return repository.Control(self.control_mode, self.control_access, presented)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        async def load(meta: RequestMeta) -> pb.RepositoryModelLoadResponse:
            parameters = {key: value for key, value in request.parameters.items()}
            await repository.load(self.core, self._control(context), request.model_name, parameters)
            return pb.RepositoryModelLoadResponse()

        return await self._answer(context, "RepositoryModelLoad", client_request_id(""), load)

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        async def unload(meta: RequestMeta) -> pb.RepositoryModelUnloadResponse:
            await repository.unload(self.core, self._control(context), request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._answer(context, "RepositoryModelUnload", client_request_id(""), unload)
