"""Content-type guards: they run before Litestar reads the body, so a wrong type is a 415, not a parse error."""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from .errors import UnsupportedMediaTypeError


def _media_type(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    return connection.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def require_json(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """application/json, or any application/*+json."""
    media = _media_type(connection)
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaTypeError(media, "application/json")


def require_multipart(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    media = _media_type(connection)
    if media != "multipart/form-data":
        raise UnsupportedMediaTypeError(media, "multipart/form-data")
