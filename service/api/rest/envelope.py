"""The fields every inference response carries beside its results."""

from __future__ import annotations

from typing import Any

from litestar import Request

from service.api.http.auth import cache_scope_of
from service.api.rest.schemas.common import UsageOut
from service.cache.response_cache import CacheControl
from service.inference import Outcome


def envelope(outcome: Outcome[Any]) -> dict[str, Any]:
    return {
        "model": outcome.model,
        "model_version": outcome.model_version,
        "cached": outcome.cached,
        "usage": UsageOut.of(outcome.usage),
    }


def cache_control(request: Request[Any, Any, Any], use_cache: bool = True) -> CacheControl:
    """The body's ``cache`` field and the ``Cache-Control`` header (no-cache, max-age=0, no-store), in the
    cache scope the key check gave the request (CACHE_SCOPE)."""
    return CacheControl.of(use_cache, request.headers.get("cache-control"), cache_scope_of(request))
