"""GET /v1/models, GET /health/live, GET /health/ready, GET /metrics."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get
from litestar.openapi.datastructures import ResponseSpec

from service.api.http.deps import HttpRequest, Services
from service.api.http.meta import request_meta
from service.api.http.openapi import also_answers
from service.api.rest.schemas.system import (
    LiveResponse,
    ModelOut,
    ModelsResponse,
    NotServedOut,
    ReadyResponse,
    RefusedOut,
    RequestLimitsOut,
    VariantOut,
)
from service.inference import InferenceService, Manifest, ServedModel
from service.observe.metrics import Metrics


def model_limits(manifest: Manifest) -> dict[str, Any]:
    """What a model can take, from its manifest: window and target lengths, QA windows, image size."""
    lengths = {
        "max_sequence_length": manifest.max_sequence_length,
        "max_source_length": manifest.max_source_length,
        "max_target_length": manifest.max_target_length,
    }
    limits: dict[str, Any] = {k: v for k, v in lengths.items() if v is not None}
    if manifest.qa is not None:
        limits.update({f"qa_{k}": v for k, v in manifest.qa.model_dump().items()})
    if manifest.preprocessing is not None:
        limits["image_size"] = list(manifest.preprocessing.image_size)
    return limits


def validation_figures(manifest: Manifest) -> dict[str, dict[str, Any]] | None:
    """The manifest's ``validation`` section (an extra the typed Manifest keeps: split -> figures), scalars
    only: the translator's sample translations stay in the manifest."""
    section = (manifest.model_extra or {}).get("validation")
    if not isinstance(section, dict):
        return None
    return {
        split: {
            k: v for k, v in figures.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)
        }
        for split, figures in section.items()
        if isinstance(figures, dict)
    }


def describe(model: ServedModel) -> ModelOut:
    m = model.loaded
    manifest_file = m.path / "manifest.json"
    return ModelOut(
        id=m.name,
        created=int(manifest_file.stat().st_mtime) if manifest_file.exists() else 0,
        name=m.name,
        task=m.task,
        version=m.version,
        versions=list(model.versions),
        architecture=m.manifest.architecture,
        description=m.manifest.description,
        execution_provider=m.provider,
        variant=m.variant.name,
        precision=m.variant.precision,
        variant_reason=m.variant.reason,
        kv_cache=("inplace" if m.inplace else "concat") if m.manifest.kv_cache is not None else None,
        variants={
            name: VariantOut.model_validate(v, from_attributes=True)  # the manifest's record, its public part
            for name, v in m.manifest.variants.items()
        },
        labels=m.manifest.labels or None,
        limits=model_limits(m.manifest),
        default_for=list(model.default_for),
        validation=validation_figures(m.manifest),
        origin=_extra_section(m.manifest, "origin"),
        checks=_extra_section(m.manifest, "checks"),
    )


def _extra_section(manifest: Manifest, key: str) -> dict[str, Any] | None:
    """A descriptive manifest section the typed Manifest keeps as an extra (an import's origin, checks)."""
    section = (manifest.model_extra or {}).get(key)
    return section if isinstance(section, dict) else None


class ModelsController(Controller):
    """Also OpenAI's model list: mounted with the OpenAI door's error shape (``api/routes.py``)."""

    path = "/v1/models"
    tags = ("models",)

    @get(summary="Loaded models (OpenAI's list), refused folders and request limits")
    async def models(self, services: Services, request: HttpRequest) -> ModelsResponse:
        """OpenAI's ``{"object": "list", "data": [{id, object, created, owned_by, ...}]}``; each model also
        carries its task, version, execution provider, labels, limits and validation figures, and the
        list the folders refused at start-up and this deployment's request limits. ``models`` is a
        deprecated alias of ``data``, kept for one release."""
        core, meta = services.inference, request_meta(request)
        listed = [describe(m) for m in core.models(meta)]
        return ModelsResponse(
            data=listed,
            models=listed,
            refused=[RefusedOut(name=n, reason=r) for n, r in core.refused(meta).items()],
            not_served=[
                NotServedOut(name=s.name, state=s.state, reason=s.reason)
                for s in core.repository(meta)
                if s.state != "READY" and s.name not in core.refused(meta)
            ],
            limits=RequestLimitsOut.model_validate(core.limits, from_attributes=True),
        )


class HealthController(Controller):
    path = "/health"
    tags = ("health",)

    @get("/live", summary="The process is up")
    async def live(self) -> LiveResponse:
        return LiveResponse()

    @get(
        "/ready",
        summary="Models loaded and warmed up (200), else 503",
        responses={
            503: ResponseSpec(
                data_container=ReadyResponse,
                description="Not ready: starting, stopping, or no model loaded (same body)",
                generate_examples=False,
            )
        },
    )
    async def ready(self, inference: InferenceService, request: HttpRequest) -> Response[ReadyResponse]:
        """200 once every loaded model is warmed up; 503 while starting, draining or stopping, with no model
        at all, or (a front end of the split service) while its engine process restarts.

        Refused folders do not make the service unready (the others serve); they are listed. Nor does
        an unreachable Redis: the cache fails open (``cache: degraded``) and requests are served uncached.
        """
        status: str = inference.phase
        meta = request_meta(request)
        names = [m.name for m in inference.models(meta)]  # the ones the caller may know of
        if status == "ready" and not inference.models(meta, every_key=True):
            status = "no_models"
        if status == "ready" and not inference.host.up:  # a front end whose engine process is restarting
            status = "engine_restarting"
        body = ReadyResponse(
            status=status,
            models={name: "ready" if status == "ready" else status for name in names},
            refused=inference.refused(meta),
            cache=await inference.cache.status(),
            cache_backend=inference.cache.kind,
        )
        headers = {} if status == "ready" else {"Retry-After": "1"}
        return Response(body, status_code=200 if status == "ready" else 503, headers=headers)


class MetricsController(Controller):
    path = "/metrics"
    tags = ("metrics",)

    @get(
        summary="Prometheus metrics",
        media_type="text/plain",
        operation_class=also_answers({"application/openmetrics-text": {"type": "string"}}),
    )
    async def metrics(self, request: Request[Any, Any, Any], metrics: Metrics) -> Response[bytes]:
        """The Prometheus text format (0.0.4), or OpenMetrics when the scraper's Accept header asks for it.

        With several workers, every worker's samples (PROMETHEUS_MULTIPROC_DIR).
        """
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})
