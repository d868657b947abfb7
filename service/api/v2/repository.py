"""The repository extension on HTTP: ``POST /v2/repository/index``, and ``.../models/{name}/load`` and
``.../unload`` (MODEL_CONTROL_MODE=explicit), as Triton and KServe serve them and ``tritonclient.http``
calls them (``get_model_repository_index``, ``load_model``, ``unload_model``)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.openapi.spec import Operation
from pydantic import ValidationError

from service.access.keys import ControlAccess, presented_key
from service.api.http.body_schema import json_schema_of
from service.api.http.client_json import parse_client_json
from service.api.http.deps import Services
from service.api.http.meta import request_meta
from service.api.http.openapi import request_body
from service.api.oip import repository
from service.api.v2.errors import V2_EXCEPTION_HANDLERS, v2_error_responses
from service.api.v2.schemas import RepositoryControlRequest, RepositoryIndexRequest, RepositoryModel
from service.errors import InvalidInputError

_INDEX_ERRORS = v2_error_responses(400, 408, 413)
_CONTROL_ERRORS = v2_error_responses(400, 403, 404, 408, 413, 422)
_INDEX_BODY: type[Operation] = request_body(json_schema_of(RepositoryIndexRequest), "Optional: {ready}")
_CONTROL_BODY: type[Operation] = request_body(
    json_schema_of(RepositoryControlRequest), "Optional: {parameters} (config and file: are refused)"
)


async def _body(request: Request[Any, Any, Any], schema: type[Any]) -> Any:
    """The optional JSON body, validated: an empty body is the schema's defaults."""
    body = await request.body()
    raw = parse_client_json(body, "the body") if body.strip() else {}
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or None
        raise InvalidInputError(
            f"{where}: {err.get('msg')}" if where else str(err.get("msg")), where
        ) from exc


def _control(services: Services, request: Request[Any, Any, Any]) -> repository.Control:
    return repository.Control(
        services.settings.model_control_mode,
        ControlAccess.from_settings(services.settings),
        presented_key(dict(request.scope["headers"])),
    )


class RepositoryController(Controller):
    path = "/v2/repository"
    tags = ("open inference protocol v2",)
    exception_handlers = V2_EXCEPTION_HANDLERS

    @post(
        "/index",
        status_code=200,
        summary="Every model folder and served model: READY, LOADING, or UNAVAILABLE with the reason",
        operation_class=_INDEX_BODY,
        responses=_INDEX_ERRORS,
    )
    async def index(self, request: Request[Any, Any, Any], services: Services) -> list[RepositoryModel]:
        ready_only = bool((await _body(request, RepositoryIndexRequest)).ready)
        return [
            RepositoryModel(name=s.name, version=s.version, state=s.state, reason=s.reason)
            for s in repository.index(services.inference, request_meta(request), ready_only)
        ]

    @post(
        "/models/{model_name:str}/load",
        status_code=200,
        summary="Load, or reload, a model from its folder (MODEL_CONTROL_MODE=explicit; ADMIN_API_KEYS)",
        operation_class=_CONTROL_BODY,
        responses=_CONTROL_ERRORS,
    )
    async def load(self, request: Request[Any, Any, Any], services: Services, model_name: str) -> None:
        """The new version warms up beside the serving one and takes over between batches; the old one
        finishes what it has. A load that fails leaves the serving version as it was."""
        data = await _body(request, RepositoryControlRequest)
        await repository.load(services.inference, _control(services, request), model_name, data.parameters)

    @post(
        "/models/{model_name:str}/unload",
        status_code=200,
        summary="Stop serving a model; its requests in flight finish (MODEL_CONTROL_MODE=explicit)",
        operation_class=_CONTROL_BODY,
        responses=_CONTROL_ERRORS,
    )
    async def unload(self, request: Request[Any, Any, Any], services: Services, model_name: str) -> None:
        await _body(request, RepositoryControlRequest)
        await repository.unload(services.inference, _control(services, request), model_name)
