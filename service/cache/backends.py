"""Where cached responses live: a size-bounded in-process LRU (the default) or Redis (REDIS_URL).

Both store opaque bytes under a string key with a TTL. Redis fails open: a
call that errors or exceeds its short socket timeout counts as an error and
returns "no entry", never an exception, so a request is served uncached.
After a failure the backend skips Redis for ``retry_interval_s`` (a down
Redis must not add a timeout to every request) and then simply tries again,
so it recovers by itself when Redis returns. Failures are logged at most
once per ``log_interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class CacheBackend(Protocol):
    kind: str  # "memory" | "redis"

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl_s: float) -> None: ...

    async def status(self) -> str:
        """For readiness: "ok", or "degraded" while a remote store is unreachable (served uncached)."""
        ...

    async def close(self) -> None: ...


class ErrorCounter(Protocol):
    def on_cache_error(self, backend: str, operation: str) -> None: ...


class MemoryCache:
    """An LRU of at most ``max_entries`` entries and ``max_bytes`` of stored values, each expiring
    ``ttl_s`` after it was stored. Single event loop, no awaits inside: no lock needed."""

    kind = "memory"

    def __init__(
        self, max_entries: int, max_bytes: int = 1 << 62, clock: Callable[[], float] = time.monotonic
    ) -> None:
        assert max_entries >= 1, "max_entries must be at least 1"
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # key -> (expires_at, value)

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        if len(value) > self.max_bytes:
            return  # would evict everything else and still not fit
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (self._clock() + ttl_s, value)
        self.bytes += len(value)
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))  # the least recently used

    def _drop(self, key: str) -> None:
        _, value = self._entries.pop(key)
        self.bytes -= len(value)

    async def status(self) -> str:
        return "ok"

    async def close(self) -> None:
        self._entries.clear()
        self.bytes = 0


class RedisCache:
    """Redis through redis-py's asyncio client and a bounded connection pool; fails open (module docstring)."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        max_connections: int,
        retry_interval_s: float,
        log_interval_s: float,
        errors: ErrorCounter | None = None,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retry_interval_s = retry_interval_s
        self.log_interval_s = log_interval_s
        self._errors = errors
        self._pool = aioredis.ConnectionPool.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
        )
        self._client = aioredis.Redis(connection_pool=self._pool, retry_on_timeout=False)
        self._down = False  # the last call failed
        self._down_until = 0.0  # monotonic time before which Redis is not tried again
        self._last_log = -float("inf")
        self._failures_since_log = 0
        self.errors = 0

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    async def get(self, key: str) -> bytes | None:
        if not self.available:
            self._count("get")
            return None
        try:
            value = await asyncio.wait_for(self._client.get(key), self.timeout_s * 2)
        except (TimeoutError, RedisError, OSError) as exc:
            self._failed("get", exc)
            return None
        self._recovered()
        return value if isinstance(value, bytes) else None

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        if not self.available:
            self._count("set")
            return
        try:
            await asyncio.wait_for(
                self._client.set(key, value, px=max(1, round(ttl_s * 1000))), self.timeout_s * 2
            )
        except (TimeoutError, RedisError, OSError) as exc:
            self._failed("set", exc)
            return
        self._recovered()

    async def status(self) -> str:
        """Pings Redis (unless it failed moments ago): "ok" or "degraded"."""
        if not self.available:
            return "degraded"
        try:
            await asyncio.wait_for(self._client.ping(), self.timeout_s * 2)
        except (TimeoutError, RedisError, OSError) as exc:
            self._failed("ping", exc)
            return "degraded"
        self._recovered()
        return "ok"

    async def close(self) -> None:
        await self._client.aclose()
        await self._pool.aclose()

    # --- failure bookkeeping -------------------------------------------------------------

    def _count(self, operation: str) -> None:
        self.errors += 1
        self._failures_since_log += 1
        if self._errors is not None:
            self._errors.on_cache_error(self.kind, operation)

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._count(operation)
        self._down = True
        now = time.monotonic()
        self._down_until = now + self.retry_interval_s
        if now - self._last_log >= self.log_interval_s:
            log.warning(
                "redis cache unavailable (%s during %s: %s); serving uncached and retrying every %.1fs "
                "(%d failed or skipped call(s) since the last report)",
                type(exc).__name__,
                operation,
                str(exc)[:200],
                self.retry_interval_s,
                self._failures_since_log,
            )
            self._last_log = now
            self._failures_since_log = 0

    def _recovered(self) -> None:
        if self._down:
            log.info("redis cache reachable again")
            self._down = False
