"""A request's response-cache policy, as every HTTP door reads it."""

from __future__ import annotations

from typing import Any

from litestar import Request

from service.api.http.auth import cache_scope_of
from service.cache.response_cache import CacheControl


def cache_control(request: Request[Any, Any, Any], use_cache: bool = True) -> CacheControl:
    """The body's ``cache`` field and the ``Cache-Control`` header (no-cache, max-age=0, no-store), in the
    cache scope the key check gave the request (CACHE_SCOPE)."""
    return CacheControl.of(use_cache, request.headers.get("cache-control"), cache_scope_of(request))
