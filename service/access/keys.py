"""API keys and what each may do, for both doors: the key table (``ApiKeys``: which paths and RPCs need a
key, the keys compared in constant time), who may change the models (``ControlAccess``), and a keyed
request's admission (``admit_key``: its quota counted, its priority's ceiling). The HTTP door applies it
in a middleware (``api/http/auth.py``), the gRPC door in an interceptor (``api/grpc/auth.py``); limits
per key live in ``quotas.py``.

A key travels as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. Keys are
compared in constant time (``hmac.compare_digest`` against every configured
key, no early exit), so response timing does not reveal how much of a guess
was right. Health probes and /metrics stay open unless AUTH_HEALTH /
AUTH_METRICS say otherwise (probes and scrapers rarely carry credentials);
the OpenAPI schema, docs and their assets stay open.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from service.access.quotas import KeyEntry, Quotas, Verdict, identify, load_keys_file
from service.errors import ForbiddenError, Problem
from service.inference.scheduling import CLASSES, NAMES, Ceiling
from service.metadata import RequestMeta
from service.settings import Settings

# Who may call what once API_KEYS is set: one table for both doors, HTTP paths by prefix and gRPC
# methods by name. ``open``: always (pages and assets hold no data); ``health`` and ``metrics``: open
# unless AUTH_HEALTH / AUTH_METRICS; anything not listed needs a key. The gRPC door's health RPCs are
# the HTTP probes' twins; ServerMetadata, like GET /v2, needs a key.
Access = Literal["open", "health", "metrics"]
HTTP_ACCESS: tuple[tuple[str, Access], ...] = (
    ("/schema", "open"),
    ("/static/", "open"),
    ("/playground", "open"),
    ("/health/", "health"),
    ("/v2/health/", "health"),
    ("/metrics", "metrics"),
    # LibreTranslate's listings, open there too (its key check guards /translate and /detect only)
    ("/languages", "open"),
    ("/frontend/settings", "open"),
)
GRPC_ACCESS: dict[str, Access] = {"ServerLive": "health", "ServerReady": "health"}


class ApiKeys:
    def __init__(
        self,
        keys: Sequence[str],
        protect_health: bool,
        protect_metrics: bool,
        scope_cache: bool = False,
        entries: Sequence[KeyEntry] = (),
        share_prefix_cache: bool = False,
    ) -> None:
        self._keys = [k.encode() for k in keys if k]
        self.entries = list(entries)  # API_KEYS_FILE: keys by hash, with their limits
        self._scope_cache = scope_cache
        self._share_prefix_cache = share_prefix_cache
        self._open: set[str] = {"open"}
        if not protect_health:
            self._open.add("health")
        if not protect_metrics:
            self._open.add("metrics")

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        """The keys and the rules of the table from API_KEYS, AUTH_HEALTH, AUTH_METRICS, CACHE_SCOPE and
        PREFIX_CACHE_SHARED_ACROSS_KEYS."""
        entries = load_keys_file(settings.api_keys_file) if settings.api_keys_file is not None else []
        enabled = settings.api_keys or entries
        keys = [*settings.api_keys, *(settings.admin_api_keys if enabled else [])]
        return cls(
            keys,
            settings.auth_health,
            settings.auth_metrics,
            settings.cache_scope == "key",
            entries,
            settings.prefix_cache_shared_across_keys,
        )

    @property
    def enabled(self) -> bool:
        return bool(self._keys or self.entries)

    def is_open(self, path: str) -> bool:
        """Whether the HTTP ``path`` answers without a key."""
        if path == "/":  # the redirect to the playground
            return True
        for prefix, access in HTTP_ACCESS:
            if path == prefix.rstrip("/") or path.startswith(prefix):
                return access in self._open
        return False

    def rpc_is_open(self, method: str) -> bool:
        """Whether the gRPC method (``ServerLive``, or its full name ``/inference.GRPCInferenceService/...``)
        answers without a key."""
        access = GRPC_ACCESS.get(method.rsplit("/", 1)[-1])
        return access is not None and access in self._open

    def cache_scope(self, presented: bytes) -> str:
        """The response-cache scope of a request that presented ``presented`` (CACHE_SCOPE=key: a digest of
        the key, never the key itself, since cache keys are readable in Redis; else the shared one, "")."""
        if not (self._scope_cache and self.enabled and presented):
            return ""
        return hashlib.sha256(b"tserve-cache-scope:" + presented).hexdigest()[:32]

    def prefix_salt(self, presented: bytes) -> str:
        """The prefix-cache tenant of a request that presented ``presented``: a digest of the key, which
        enters the first block's hash (vLLM's ``cache_salt``), so that no key reuses, or can time, the
        cached prompt of another; "" (one cache for everyone) without keys or with
        PREFIX_CACHE_SHARED_ACROSS_KEYS."""
        if self._share_prefix_cache or not (self.enabled and presented):
            return ""
        return hashlib.sha256(b"tserve-prefix-salt:" + presented).hexdigest()[:32]

    def accepts(self, presented: bytes) -> bool:
        return self._plain(presented) or self.identify(presented) is not None

    def _plain(self, presented: bytes) -> bool:
        valid = False
        for key in self._keys:  # every key is compared, whichever matches
            valid |= hmac.compare_digest(presented, key)
        return valid

    def identify(self, presented: bytes) -> KeyEntry | None:
        """The API_KEYS_FILE entry of the presented key (None: a plain API key, or none)."""
        return identify(self.entries, presented) if self.entries and presented else None


LOOPBACK = ("127.0.0.1", "::1", "localhost")


class ControlAccess:
    """Who may load and unload models: a key of ADMIN_API_KEYS (an admin key is an API key too), or, with
    none set, anyone who can reach a service that listens on loopback only. One rule for both doors."""

    def __init__(self, admin_keys: Sequence[str], loopback_only: bool) -> None:
        self._keys = ApiKeys(admin_keys, True, True)
        self.loopback_only = loopback_only

    @classmethod
    def from_settings(cls, settings: Settings) -> ControlAccess:
        return cls(settings.admin_api_keys, settings.host in LOOPBACK)

    def describe(self) -> str:
        """For the start-up log: which case holds."""
        if self._keys.enabled:
            return "repository control answers ADMIN_API_KEYS only"
        if self.loopback_only:
            return "no ADMIN_API_KEYS: repository control is open to callers on this host (HOST is loopback)"
        return "no ADMIN_API_KEYS and HOST is not loopback: repository control is refused"

    def check(self, presented: bytes) -> None:
        """Raise ``ForbiddenError`` unless ``presented`` may make a control call."""
        if self._keys.enabled:
            if not (presented and self._keys.accepts(presented)):
                raise ForbiddenError("loading and unloading models needs a key of ADMIN_API_KEYS")
        elif not self.loopback_only:
            raise ForbiddenError(
                "loading and unloading models needs ADMIN_API_KEYS when the service listens beyond loopback"
            )


def presented_key(headers: Mapping[bytes, bytes]) -> bytes:
    """The key a request presents (lower-case header names): ``Authorization: Bearer KEY`` or ``X-API-Key``;
    the gRPC door reads its metadata with the same rule."""
    authorization = headers.get(b"authorization", b"")
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return headers.get(b"x-api-key", b"").strip()


@dataclass(frozen=True)
class Admission:
    """A keyed request let through: the ``RateLimit-*`` headers of its answer, its key's ceiling (which notes
    whether a request asked for more), and how its quota counted it (for a refund)."""

    entry: KeyEntry
    headers: tuple[tuple[str, str], ...]
    ceiling: Ceiling
    verdict: Verdict | None = None

    def scheduled(self, meta: RequestMeta) -> RequestMeta:
        """The request's metadata at its key's default class, never more urgent than its ceiling (which then
        applies to whatever the request's headers and body ask for)."""
        default = CLASSES[self.entry.priority] if self.entry.priority else None
        return meta.scheduled(default, ceiling=self.ceiling)

    def answer_headers(self) -> tuple[tuple[str, str], ...]:
        """The headers its answer carries: ``RateLimit-*``, and ``X-Request-Priority-Served`` when the request
        asked for a class more urgent than its key's ceiling and was served at the ceiling."""
        if self.ceiling.lowered_from is None:
            return self.headers
        return (*self.headers, (PRIORITY_SERVED, NAMES[self.ceiling.most_urgent]))

    async def settle(self, quotas: Quotas | None, refused_without_work: bool) -> None:
        """After the answer: a refusal that did no work is given back to the key's requests per minute."""
        if refused_without_work and quotas is not None and self.verdict is not None:
            await quotas.refund(self.entry, self.verdict)


# The answer's header that says a request was served at its key's ceiling, not at the class it asked for.
PRIORITY_SERVED = "X-Request-Priority-Served"


async def admit_key(entry: KeyEntry, quotas: Quotas | None) -> tuple[Problem | None, Admission]:
    """Count the request against its key's quota: the refusal to send (429, or 503 when the store failed
    and QUOTA_FAIL_OPEN is false), if any, and the request's ``Admission``. The same for both doors,
    which carry the key in the request's metadata (``service/metadata.py``: for the core, its models and
    its tokens)."""
    admitted = Admission(entry, (), Ceiling(CLASSES[entry.ceiling]))
    if quotas is None:
        return None, admitted
    verdict = await quotas.admit(entry)
    if verdict.allowed:
        return None, dataclasses.replace(admitted, headers=verdict.headers, verdict=verdict)
    if verdict.unavailable:
        problem = Problem(
            "unavailable", "the quota store is unavailable (QUOTA_FAIL_OPEN=false)", retry_after_s=1
        )
        return problem, admitted
    per = "requests" if verdict.limit == "requests" else "tokens"
    retry = next((int(v) for k, v in verdict.headers if k == "Retry-After"), 1)
    headers = tuple((k, v) for k, v in verdict.headers if k != "Retry-After")
    message = f"key {entry.id!r} has used its {per} per minute; retry after {retry}s"
    return Problem("quota_exceeded", message, retry_after_s=retry, headers=headers), admitted
