"""What a request carries besides its inputs, in one value passed down every call that needs it.

The doors build it once per request (HTTP: ``api/http/meta.py``, fed by the key check and the scheduling
headers; gRPC: the servicer, from its interceptor's admission), refine it by the body's own priority and
timeout (``with_body``), and hand it to the inference core; the core hands it to the pipelines and they
to the engine's queues, or to the engine process (``ipc/workers.py`` turns it into ``messages.Asked``).
Nothing below the doors reads a context variable for it: what a call depends on is in its signature, as in
vLLM v1's ``EngineCoreRequest``.

- ``scheduling``: the priority class, deadline and key ceiling (``engine/scheduling.py``), read by the
  engines' queues;
- ``key``: the caller's key entry (API_KEYS_FILE), for the models it may see and the tokens it is charged;
- ``prefix_salt``: the caller's prefix-cache tenant ("": the shared cache);
- ``trace``: the span the engine's spans of this request are children of (None: untraced, or not yet
  handed to a queue).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.context import Context

from service.engine.scheduling import DEFAULT, Ceiling, Scheduling


class Key(Protocol):
    """What the core needs of a caller's key (``access.quotas.KeyEntry``)."""

    @property
    def id(self) -> str: ...

    def may_use(self, model: str) -> bool: ...


@dataclass(frozen=True)
class RequestMeta:
    request_id: str = ""
    scheduling: Scheduling = DEFAULT
    key: Key | None = None
    prefix_salt: str = ""
    trace: Context | None = None

    def scheduled(
        self, priority: int | None = None, timeout_s: float | None = None, ceiling: Ceiling | None = None
    ) -> RequestMeta:
        """This request queued with ``priority`` (None: as so far) and a deadline ``timeout_s`` from now,
        never later than the one it has (None: as so far); ``ceiling`` (None: the one it has, if any) lowers
        a more urgent class to the most urgent it allows, and notes that it did."""
        outer = self.scheduling
        deadline = outer.deadline if timeout_s is None else time.monotonic() + timeout_s
        if outer.deadline is not None and deadline is not None:
            deadline = min(deadline, outer.deadline)
        ceiling = ceiling if ceiling is not None else outer.ceiling
        chosen = outer.priority if priority is None else priority
        if ceiling is not None:
            chosen = ceiling.apply(chosen)
        return dataclasses.replace(self, scheduling=Scheduling(chosen, deadline, ceiling))

    def with_body(self, priority: int | None, timeout_s: float | None) -> RequestMeta:
        """Refined by a body's own ``priority`` and timeout fields (None where it has none)."""
        if priority is None and timeout_s is None:
            return self
        return self.scheduled(priority, timeout_s)

    def keyed(self, key: Key | None, prefix_salt: str = "") -> RequestMeta:
        return dataclasses.replace(self, key=key, prefix_salt=prefix_salt)

    def traced(self, trace: Context | None) -> RequestMeta:
        return self if trace is self.trace else dataclasses.replace(self, trace=trace)

    def may_see(self, name: str) -> bool:
        """Whether the caller may know of model ``name``: every model, unless its key declares a model list.
        A model the key may not use is, to that key, a model that does not exist."""
        return self.key is None or bool(self.key.may_use(name))

    def visible(self, names: Iterable[str]) -> list[str]:
        """The names of ``names`` the caller may know of (``may_see``)."""
        return [name for name in names if self.may_see(name)]

    @property
    def key_id(self) -> str | None:
        return self.key.id if self.key is not None else None


ANONYMOUS = RequestMeta()
"""A request of no key, at the default class and without a deadline: warm-ups, tests, internal work."""
