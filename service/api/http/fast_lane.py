"""The JSON inference routes' fast lane: the route's own handler, called without Litestar's per-request
machinery once the body is known to be a valid one.

A JSON route (``guards.json_post``) costs Litestar a ``before_request`` hook, its kwargs model, dependency
resolution, a signature model's second pass over the values, and a response object with its renderer:
measured with the fake engine (benchmarks/README.md, "The request path"), more than the route's own work.
For a POST route whose handler takes only ``services``, ``request``, ``data`` (a pydantic body) and path
parameters, guarded by ``guards.require_json``, ``guards.read_json`` or nothing, this lane does what those
steps do, for the requests they would accept:

- the content type is checked as ``require_json`` checks it (``read_json`` takes any);
- the body is decoded as Litestar decodes it (``msgspec``) and validated as it validates it (the body
  model's ``model_validate``, not strict); a route without ``data`` reads its own body;
- the handler is called with the app's ``Services``, a ``Request`` on the same scope, the body model and
  the path parameters Litestar parsed;
- a pydantic result is encoded as Litestar encodes it (``model_dump(mode="json")``, then msgspec) with
  the same headers; any other result (a streamed response) goes through the handler's own
  ``to_response``.

A request the lane would answer differently never enters it: a wrong content type, a body that does not
decode or validate, goes the usual way, so its error is Litestar's, word for word. What the handler raises
propagates to the same exception handlers as before. The routes stay Litestar's routes: the same paths,
OpenAPI document and errors.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request
from litestar._asgi.utils import wrap_in_exception_handler  # the one Litestar places before a route's handler
from litestar.handlers.http_handlers import HTTPRouteHandler
from litestar.types import Receive, Scope, Send
from pydantic import BaseModel

from service.api.http.guards import read_json, require_json

_JSON = [(b"content-type", b"application/json")]
_CALL = "tserve.fast_lane"  # the scope's key for the call the lane makes (route, arguments)
_PATH_PARAMETERS = {"model_name", "model_version"}
_PARAMETERS = {"services", "request", "data", *_PATH_PARAMETERS}


@dataclass(frozen=True)
class _Route:
    handler: HTTPRouteHandler
    fn: Callable[..., Any]
    body: type[BaseModel] | None  # None: the handler reads its own body
    json_only: bool  # the content type must be JSON (``require_json``)
    parameters: frozenset[str]


def _media_is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (
                media.startswith(b"application/") and media.endswith(b"+json")
            )
    return False


class FastLane:
    """The fast lane of one app: which of its route handlers may take it (decided once per handler)."""

    def __init__(self) -> None:
        self._routes: dict[int, _Route | None] = {}
        # What the handler raises is answered as on the usual way, by Litestar's exception middleware placed
        # where the usual way places it: inside the service's middlewares, so their send wrappers (the
        # request id, the metrics) see the error answer too.
        self._guarded = wrap_in_exception_handler(self._answer)

    def _route(self, handler: Any) -> _Route | None:
        key = id(handler)
        if key not in self._routes:
            self._routes[key] = _eligible(handler)
        return self._routes[key]

    async def serve(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> bool:
        """Answer the request if it is one for the lane (True); False: the app answers it as usual."""
        route = self._route(scope.get("route_handler"))
        if route is None or (route.json_only and not _media_is_json(scope)):
            return False
        kwargs: dict[str, Any] = {}
        if route.body is not None:
            try:
                kwargs["data"] = route.body.model_validate(msgspec.json.decode(body))
            except Exception:  # Litestar's own path answers with its own error
                return False
        scope[_CALL] = (route, kwargs)  # type: ignore[literal-required]
        await self._guarded(scope, receive, send)
        return True

    @staticmethod
    async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
        route, kwargs = scope.pop(_CALL)  # type: ignore[misc]
        app = scope["litestar_app"]  # type: ignore[typeddict-item]
        request: Request[Any, Any, Any] = Request(scope, receive, send)
        if "services" in route.parameters:
            kwargs["services"] = app.state.services
        if "request" in route.parameters:
            kwargs["request"] = request
        path = scope.get("path_params") or {}
        for name in route.parameters & _PATH_PARAMETERS:
            if name in path:
                kwargs[name] = path[name]
        result = await route.fn(**kwargs)
        if isinstance(result, BaseModel):
            content = msgspec.json.encode(result.model_dump(mode="json"))
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_JSON, (b"content-length", str(len(content)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": content, "more_body": False})
            return
        response = await route.handler.to_response(app=app, data=result, request=request)
        await response(scope, receive, send)


def _eligible(handler: Any) -> _Route | None:
    """The route of ``handler`` when the lane may serve it (see the module's docstring)."""
    if not isinstance(handler, HTTPRouteHandler) or handler.http_methods != {"POST"}:
        return None
    hook = handler.before_request
    if hook not in (None, require_json, read_json):
        return None
    if handler.resolve_guards() or handler.resolve_after_response() or handler.status_code != 200:
        return None
    if any(getattr(layer, "after_request", None) for layer in handler.ownership_layers):
        return None
    if handler.resolve_response_headers() or handler.resolve_response_cookies():
        return None
    parameters = frozenset(inspect.signature(handler.fn).parameters)
    if not parameters <= _PARAMETERS:
        return None
    body = None
    if "data" in parameters:
        body = handler.parsed_fn_signature.parameters["data"].annotation
        if hook is None or not (isinstance(body, type) and issubclass(body, BaseModel)):
            return None
    elif hook is not None:
        return None
    return _Route(handler, handler.fn, body, hook is require_json, parameters)
