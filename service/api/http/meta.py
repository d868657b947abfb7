"""A request's metadata (``service/metadata.py``) on the HTTP doors: built by the middlewares, in the
ASGI scope's state, and read once by each handler (``request_meta``), which refines it by its body's own
fields and passes it to the inference core.

- ``observe.py`` opens it with the request id;
- ``auth.py`` adds the caller's key, its prefix-cache salt, its default class and its ceiling;
- ``scheduling.py`` adds ``X-Request-Priority`` and ``X-Request-Timeout-Ms``;
- ``admission.py`` sheds low priority by the class found so far (a body's ``priority`` orders the
  queue only).
"""

from __future__ import annotations

from typing import Any

from litestar.types import Scope

from service.metadata import ANONYMOUS, RequestMeta

META_KEY = "request_meta"  # in scope["state"]


def meta_of(scope: Scope) -> RequestMeta:
    """The metadata the middlewares built for this request (``ANONYMOUS`` where none ran)."""
    meta = (scope.get("state") or {}).get(META_KEY)
    return meta if isinstance(meta, RequestMeta) else ANONYMOUS


def set_meta(scope: Scope, meta: RequestMeta) -> None:
    scope.setdefault("state", {})[META_KEY] = meta  # type: ignore[typeddict-item]


def request_meta(request: Any) -> RequestMeta:
    """A handler's ``request``'s metadata: what the handler hands the core."""
    return meta_of(request.scope)
