"""The response cache's storage: an in-process LRU by default, Redis when REDIS_URL is set."""

from __future__ import annotations

from service.settings import Settings

from .backends import CacheBackend, ErrorCounter, MemoryCache, RedisCache
from .keys import blob_digest, canonical_json, response_key


def build_backend(settings: Settings, errors: ErrorCounter | None = None) -> CacheBackend | None:
    """The configured backend, or None when CACHE_ENABLED is false."""
    if not settings.cache_enabled:
        return None
    if settings.redis_url:
        return RedisCache(
            settings.redis_url,
            timeout_s=settings.redis_timeout_s,
            max_connections=settings.redis_max_connections,
            retry_interval_s=settings.cache_retry_interval_s,
            log_interval_s=settings.cache_error_log_interval_s,
            errors=errors,
        )
    return MemoryCache(settings.cache_max_entries, settings.cache_max_bytes)


__all__ = [
    "CacheBackend",
    "ErrorCounter",
    "MemoryCache",
    "RedisCache",
    "blob_digest",
    "build_backend",
    "canonical_json",
    "response_key",
]
