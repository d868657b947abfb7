"""The app factory and its lifespan: load the repository, start one engine per model, warm up, serve.

``create_app(settings)`` builds the Litestar app; the lifespan then

1. loads every folder under MODEL_REPOSITORY (a refused folder gets one log
   line from the loader; the others serve),
2. builds a pipeline per model: a DynamicBatcher for encoder models and the
   translator, a GenerationEngine for text-generation models, each reporting
   to the metrics through its observer,
3. opens the response cache (Redis when REDIS_URL is set, else an in-process
   LRU),
4. starts each pipeline and warms it up with one real small inference, and
   only then reports ready (GET /health/ready);

and on shutdown stops the pipelines in reverse order, letting in-flight work
finish within SHUTDOWN_TIMEOUT_S, then closes the cache. Draining before that
(SIGTERM) is ``service.lifecycle``. Handlers reach the services through
dependency injection from ``app.state``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIResponse,
    Reference,
    SecurityScheme,
)
from prometheus_client import multiprocess as prometheus_multiprocess

from service import gc_tuning
from service.access.keys import ApiKeys, ControlAccess
from service.access.quotas import Quotas, windows_for
from service.api.grpc.server import GrpcServer
from service.api.http.admission import Shedding, admit_requests
from service.api.http.auth import require_api_key
from service.api.http.body_key import keys_from_bodies
from service.api.http.deps import Services, provide_inference, provide_metrics, provide_services
from service.api.http.errors import EXCEPTION_HANDLERS
from service.api.http.fast_lane import FastLane
from service.api.http.observe import observe_requests
from service.api.http.raw_errors import RAW_SHAPES_KEY
from service.api.http.request_id import ensure_request_id_header
from service.api.http.scheduling import schedule_requests
from service.api.openai.errors import is_openai_path
from service.api.pages.docs_ui import assets_router, render_plugins
from service.api.routes import BODY_KEYED, CONTROLLERS, RAW_ERROR_SHAPES
from service.cache import build_backend
from service.cache.response_cache import ResponseCache
from service.engine import runtime
from service.errors import describe_status
from service.inference.limits import RequestLimits
from service.inference.service import Host, InferenceService
from service.ipc.remote_host import RemoteHost
from service.lifecycle import Lifecycle
from service.models.host import ModelHost
from service.models.memory import MemoryTrimmer
from service.observe.logs import configure_logging
from service.observe.loop_lag import LoopLag
from service.observe.metrics import Metrics, multiprocess_enabled
from service.observe.tracing import Tracing
from service.process import die_with_parent
from service.settings import OWN_PROCESS_FLAG, SHARED_POOL_FLAG, Settings
from service.supervisor import frontend_folder

log = logging.getLogger("service")

API_VERSION = "1.0"


def _cors(settings: Settings) -> CORSConfig | None:
    """CORS is off unless CORS_ALLOW_ORIGINS names origins."""
    if not settings.cors_allow_origins:
        return None
    return CORSConfig(
        allow_origins=settings.cors_allow_origins,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type", "X-API-Key", "X-Request-ID", "Cache-Control"],
        expose_headers=["X-Request-ID", "Retry-After"],
        max_age=600,
    )


def _openapi(keys: ApiKeys) -> OpenAPIConfig:
    schemes: dict[str, SecurityScheme | Reference] = {
        "bearer": SecurityScheme(type="http", scheme="bearer"),
        "apiKey": SecurityScheme(type="apiKey", name="X-API-Key", security_scheme_in="header"),
    }
    return OpenAPIConfig(
        render_plugins=render_plugins(),
        title="Transformer serving",
        version=API_VERSION,
        description="Translation, classification (text and images), generation, QA and entities over "
        'ONNX Runtime. Every error answers {"error": {type, message, field, request_id, errors}}.',
        components=Components(security_schemes=schemes if keys.enabled else None),
        security=[{name: []} for name in schemes] if keys.enabled else None,
    )


def _document_unauthorized(app: Litestar, keys: ApiKeys) -> None:
    """Add the 401 answer to every operation that needs a key (the middleware, not a handler, sends it)."""
    schema = app.openapi_schema
    for path, item in (schema.paths or {}).items():
        if keys.is_open(path):
            continue
        for operation in (item.get, item.post):
            if operation is not None and operation.responses is not None:
                body = "OpenAIErrorBody" if is_openai_path(path) else "ErrorBody"  # raw_errors.send_error
                operation.responses["401"] = OpenAPIResponse(
                    description=describe_status(401),
                    content={
                        "application/json": OpenAPIMediaType(schema=Reference(f"#/components/schemas/{body}"))
                    },
                )


def create_app(settings: Settings | None = None) -> Litestar:
    """The Litestar app for ``settings`` (default: from the environment)."""
    settings = settings if settings is not None else Settings()
    configure_logging(settings)
    if (
        os.environ.get(SHARED_POOL_FLAG) == "1"
        and not runtime.shared_thread_pool_in_use()
        and frontend_folder() is None  # a front end runs no model
    ):
        # python -m service (or one of its workers) owns this process: one ONNX Runtime pool for all.
        runtime.use_shared_thread_pool(settings.intra_op_threads, settings.inter_op_threads)
    metrics = Metrics.from_settings(settings)
    state = State(
        {
            "settings": settings,
            "limits": RequestLimits.from_settings(settings),
            "metrics": metrics,
            RAW_SHAPES_KEY: RAW_ERROR_SHAPES,
        }
    )
    lifecycle = Lifecycle(state, settings.shutdown_timeout_s)
    state.lifecycle = lifecycle
    tracing = Tracing.from_environment(lambda reason, count: metrics.spans_dropped.labels(reason).inc(count))
    loop_lag = LoopLag(on_sample=metrics.event_loop_lag.observe)
    shedding = Shedding(loop_lag, settings.shed_lag_ms / 1000, metrics.shed.inc, settings.shed_queue_depth)
    keys = ApiKeys.from_settings(settings)
    quotas = (
        Quotas(
            windows_for(settings.redis_url, settings.cache_key_prefix, settings.redis_timeout_s),
            settings.quota_fail_open,
            metrics,
        )
        if keys.entries
        else None
    )

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        folder = frontend_folder()
        host: Host
        if folder is not None:  # a front end of the split service: the engine process runs the models
            die_with_parent()
            host = RemoteHost(settings, folder, metrics)
            shedding.urgent_waiting = host.client.urgent_waiting  # shed low priority by the engine's queues
        else:
            host = await ModelHost.open(settings, metrics)
        cache = ResponseCache(
            build_backend(settings, errors=metrics),
            ttl_s=settings.cache_ttl_s,
            prefix=settings.cache_key_prefix,
            observer=metrics,
        )
        controlled = settings.model_control_mode != "none"
        inference = InferenceService(host, cache, state.limits, quotas)
        if lifecycle.draining:  # SIGTERM arrived while loading
            inference.drain()
        app.state.inference = inference
        app.state.services = Services(inference, settings)
        grpc_server = (
            GrpcServer(inference, lifecycle, settings, metrics, quotas, tracing.grpc_interceptors())
            if settings.grpc_port is not None
            else None
        )
        trimmer = MemoryTrimmer(settings.malloc_trim_mib)
        try:
            await inference.start(warmup=settings.warmup)
            if grpc_server is not None:
                await grpc_server.start()
            trimmer.start()
            if os.environ.get(OWN_PROCESS_FLAG) == "1":  # python -m service: the process is the service's
                gc_tuning.settle(settings.gc_threshold)
            loop_lag.start()
            if controlled:
                log.info(
                    "model control: %s; %s",
                    settings.model_control_mode,
                    ControlAccess.from_settings(settings).describe(),
                )
            log.info(
                "ready: %d model(s) serving (%s), %d refused; response cache: %s",
                len(host.registry.pipelines),
                ", ".join(host.registry.pipelines) or "none",
                len(host.registry.refused),
                cache.kind,
            )
            yield
        finally:
            loop_lag.stop()
            await trimmer.stop()
            if grpc_server is not None:
                await grpc_server.stop()
            await inference.stop(settings.shutdown_timeout_s)
            await cache.close()
            if quotas is not None:
                await quotas.windows.close()
            if multiprocess_enabled():
                prometheus_multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
            tracing.shutdown()  # the spans still queued, exported within the exporter's timeout

    app = Litestar(
        route_handlers=[*CONTROLLERS, assets_router()],
        lifespan=[lifespan],
        dependencies={
            "inference": Provide(provide_inference, sync_to_thread=False),
            "services": Provide(provide_services, sync_to_thread=False),
            "metrics": Provide(provide_metrics, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        before_send=[ensure_request_id_header],
        middleware=[  # the key check only where keys are configured: a layer costs on every request
            observe_requests(metrics, settings.access_log),
            *(
                [
                    keys_from_bodies(BODY_KEYED, settings.max_body_bytes, settings.body_read_timeout_s),
                    require_api_key(keys, quotas),
                ]
                if keys.enabled
                else []
            ),
            schedule_requests(),
            admit_requests(
                lifecycle,
                settings.max_in_flight_requests,
                settings.max_body_bytes,
                settings.body_read_timeout_s,
                shedding,
                FastLane(),
            ),
        ],
        cors_config=_cors(settings),
        request_max_body_size=settings.max_body_bytes,  # Litestar's own check; admission.py refuses first
        logging_config=None,  # ours (service.observe.logs): every line carries the request id and model, on one line
        state=state,
        openapi_config=_openapi(keys),
    )
    if keys.enabled:
        _document_unauthorized(app, keys)
    return app
