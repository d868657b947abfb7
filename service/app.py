"""The app factory and its lifespan: load the repository, start one engine per model, warm up, serve.

``create_app(settings)`` builds the Litestar app; the lifespan then

1. loads every folder under MODEL_REPOSITORY (a refused folder gets one log
   line from the loader; the others serve),
2. builds a pipeline per model: a DynamicBatcher for encoder models and the
   translator, a GenerationEngine for text-generation models,
3. starts each and warms it up with one real small inference, and only then
   reports ready (GET /health/ready);

and on shutdown stops the pipelines in reverse order, letting in-flight work
finish within SHUTDOWN_TIMEOUT_S. Handlers reach the services through
dependency injection from ``app.state``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from service.api.controllers import CONTROLLERS
from service.api.deps import provide_inference, provide_limits, provide_settings
from service.api.errors import EXCEPTION_HANDLERS
from service.api.limits import RequestLimits
from service.api.request_id import request_id_middleware
from service.engine.repository import load_repository
from service.engine.runtime import RuntimeOptions
from service.inference.batched import ModelPipeline
from service.inference.factory import build_pipeline
from service.inference.registry import ModelRegistry
from service.inference.service import InferenceService
from service.settings import Settings

log = logging.getLogger("service")

API_VERSION = "1.0"


def runtime_options(settings: Settings) -> RuntimeOptions:
    return RuntimeOptions(
        device=settings.device,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
    )


async def build_registry(settings: Settings) -> ModelRegistry:
    """Load the repository (blocking ONNX Runtime work, off the event loop) and build every pipeline."""
    loaded, refused = await asyncio.to_thread(
        load_repository, settings.model_repository, runtime_options(settings)
    )
    pipelines: list[ModelPipeline] = []
    for name, model in loaded.items():
        try:
            pipelines.append(build_pipeline(model, settings))
        except Exception as exc:  # a manifest the loader accepted but a pipeline cannot use
            log.error("refusing model %s: %r", name, exc)
            refused[name] = f"cannot serve: {exc!r}"
    return ModelRegistry(pipelines, refused)


def _configure_logging(settings: Settings) -> None:
    """Our loggers' level; a handler only when nobody (uvicorn, pytest) configured one."""
    level = "DEBUG" if settings.log_level == "trace" else settings.log_level.upper()
    logging.getLogger("service").setLevel(level)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def create_app(settings: Settings | None = None) -> Litestar:
    """The Litestar app for ``settings`` (default: from the environment)."""
    settings = settings if settings is not None else Settings()
    _configure_logging(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        inference = InferenceService(await build_registry(settings))
        app.state.inference = inference
        try:
            await inference.start(warmup=settings.warmup)
            registry = inference.registry
            log.info(
                "ready: %d model(s) serving (%s), %d refused",
                len(registry.pipelines),
                ", ".join(registry.pipelines) or "none",
                len(registry.refused),
            )
            yield
        finally:
            await inference.stop(settings.shutdown_timeout_s)

    return Litestar(
        route_handlers=CONTROLLERS,
        lifespan=[lifespan],
        dependencies={
            "inference": Provide(provide_inference, sync_to_thread=False),
            "limits": Provide(provide_limits, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[request_id_middleware],
        request_max_body_size=settings.max_body_bytes,
        state=State(
            {
                "settings": settings,
                "limits": RequestLimits.from_settings(settings),
                # Until the lifespan has loaded the models: nothing to serve, readiness says "starting".
                "inference": InferenceService(ModelRegistry([], {})),
            }
        ),
        openapi_config=OpenAPIConfig(
            title="Transformer serving",
            version=API_VERSION,
            description="Translation, classification (text and images), generation, QA and entities over "
            'ONNX Runtime. Every error answers {"error": {type, message, field, request_id, errors}}.',
        ),
    )
