"""The core's parameter names -> one door's field names, for the errors the core raises.

The inference core names what is wrong in its own words (``inputs`` with the
item's index, ``contexts``, ``max_new_tokens``, ``attention_layer``...); each
door says once, per request shape, what its client calls those
(``texts[2]``, ``prompt``, ``parameters.max_tokens``, ``question[0]``) and
wraps its call to the core in that mapping::

    with FieldNames({"inputs": "texts[{i}]"}, {"inputs": "texts"}):
        outcome = await core.classify_texts(meta, ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import TracebackType

from service.errors import ServiceError


class FieldNames:
    """``indexed``: a parameter's name for one item (``{i}`` is its index); ``names``: for the whole
    parameter, or an item where ``indexed`` has no entry. Names neither lists pass through as they are."""

    def __init__(self, indexed: Mapping[str, str], names: Mapping[str, str] | None = None) -> None:
        self.indexed = dict(indexed)
        self.names = dict(names or {})

    def field(self, param: str | None, index: int | None) -> str | None:
        if param is None:
            return None
        if index is not None and param in self.indexed:
            return self.indexed[param].format(i=index)
        return self.names.get(param, param)

    def rename(self, exc: ServiceError) -> None:
        """The door's name for the error's field (a name already the door's passes through unchanged)."""
        exc.field = self.field(exc.field, exc.index)

    def __enter__(self) -> FieldNames:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, ServiceError):
            self.rename(exc)


@cache
def one_or_many(single: str, batch: str, is_single: bool, **names: str) -> FieldNames:
    """The common shape: one input under ``single`` (``text``) or a list under ``batch`` (``texts``).
    A mapping holds no state, so each shape is built once and shared by every request."""
    if is_single:
        return FieldNames({"inputs": single}, {"inputs": single, **names})
    return FieldNames({"inputs": f"{batch}[{{i}}]"}, {"inputs": batch, **names})
