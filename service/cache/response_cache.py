"""The response cache in front of the pipelines: look up, or compute and store, one request's Outcome.

What is cached: classification, extraction and translation (deterministic),
and generation when it is greedy or seeded; streams are not (see
``InferenceService.open_stream``). A request may skip the lookup
(``Cache-Control: no-cache`` or ``"cache": false``: computed fresh, then
stored) or skip the cache entirely (``Cache-Control: no-store``).

The stored value is the results and usage as JSON; ``model`` and
``model_version`` come from the key's identity, ``cached`` is set on a hit.
A value that does not decode (written by another build) is a miss.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import TypeAdapter, ValidationError

from service.observe import spans
from service.pipelines.results import Outcome, Usage

from .backends import CacheBackend
from .keys import response_key

log = logging.getLogger(__name__)

R = TypeVar("R")


class Answering(Protocol):
    """What the cache needs of the pipeline that answers: its model's name, version and task."""

    @property
    def name(self) -> str: ...

    task: str
    model: Any  # .version: the manifest's content hash


@dataclass(frozen=True)
class CacheControl:
    """What one request lets the cache do, and whose entries it may see.

    ``scope`` partitions the cache: requests see only entries stored under their own scope (with
    CACHE_SCOPE=key, a digest of the API key that sent them; empty: the one shared space).
    """

    lookup: bool = True
    store: bool = True
    scope: str = ""

    @classmethod
    def of(cls, use_cache: bool = True, header: str | None = None, scope: str = "") -> CacheControl:
        """From the body's ``cache`` field and a ``Cache-Control`` request header."""
        directives = {d.strip().lower() for d in (header or "").split(",") if d.strip()}
        if "no-store" in directives:
            return cls(lookup=False, store=False, scope=scope)
        fresh = "no-cache" in directives or "max-age=0" in directives
        return cls(lookup=use_cache and not fresh, store=True, scope=scope)


USE_CACHE = CacheControl()
BYPASS = CacheControl(lookup=False, store=False)


class CacheObserver(Protocol):
    def on_cache_hit(self, model: str) -> None: ...

    def on_cache_miss(self, model: str) -> None: ...


class ResponseCache:
    """Look-up and storage of Outcomes in a backend (None: caching off, everything computes)."""

    def __init__(
        self,
        backend: CacheBackend | None,
        ttl_s: float,
        prefix: str,
        observer: CacheObserver | None = None,
    ) -> None:
        self.backend = backend
        self.ttl_s = ttl_s
        self.prefix = prefix
        self._observer = observer
        self._adapters: dict[type[Any], TypeAdapter[Any]] = {}

    @property
    def kind(self) -> str:
        return self.backend.kind if self.backend is not None else "disabled"

    async def status(self) -> str:
        return await self.backend.status() if self.backend is not None else "disabled"

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()

    async def get_or_compute(
        self,
        pipeline: Answering,
        *,
        request: Mapping[str, Any],
        result_type: type[R],
        control: CacheControl,
        compute: Callable[[], Awaitable[Outcome[R]]],
    ) -> Outcome[R]:
        """``pipeline``'s answer to ``request``: from the cache (keyed by its name, version and task), or
        computed (and stored, unless ``control`` says otherwise)."""
        if self.backend is None or not (control.lookup or control.store):
            return await compute()
        model, version = pipeline.name, pipeline.model.version
        key = response_key(self.prefix, model, version, pipeline.task, request, control.scope)
        if control.lookup:
            with spans.span("cache lookup", {"cache.backend": self.backend.kind}) as lookup:
                hit = self._decode(await self.backend.get(key), model, version, result_type)
                if lookup is not None:
                    lookup.set_attribute("cache.hit", hit is not None)
            if hit is not None:
                if self._observer is not None:
                    self._observer.on_cache_hit(model)
                return hit
            if self._observer is not None:
                self._observer.on_cache_miss(model)
        outcome = await compute()
        if control.store:
            await self.backend.set(key, self._encode(outcome, result_type), self.ttl_s)
        return outcome

    # --- the stored form -------------------------------------------------------------------

    def _adapter(self, result_type: type[R]) -> TypeAdapter[list[R]]:
        if result_type not in self._adapters:
            self._adapters[result_type] = TypeAdapter(list[result_type])  # type: ignore[valid-type]
        return self._adapters[result_type]

    def _encode(self, outcome: Outcome[R], result_type: type[R]) -> bytes:
        results = self._adapter(result_type).dump_python(outcome.results, mode="json")
        usage = {"input_tokens": outcome.usage.input_tokens, "output_tokens": outcome.usage.output_tokens}
        return json.dumps({"results": results, "usage": usage}, separators=(",", ":")).encode()

    def _decode(self, raw: bytes | None, model: str, version: str, result_type: type[R]) -> Outcome[R] | None:
        if raw is None:
            return None
        try:
            stored = json.loads(raw)
            results = self._adapter(result_type).validate_python(stored["results"])
            usage = Usage(**stored["usage"])
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning("ignoring an undecodable cache entry for %s: %r", model, exc)
            return None
        return Outcome(model, version, results, usage, cached=True)
