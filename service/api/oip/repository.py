"""The Open Inference Protocol's repository extension on the inference core, for both transports: the
index, and load and unload (Triton's explicit model control).

A load or unload needs MODEL_CONTROL_MODE=explicit and the caller's key to pass ``ControlAccess``
(ADMIN_API_KEYS); in ``poll`` mode the repository's folders decide, and in ``none`` the calls are not
there (404, gRPC ``UNIMPLEMENTED``), as before control existed. A model is always loaded from its own
folder: the protocol's ``config`` and ``file:`` parameters, which would write files, are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from service.access.keys import ControlAccess
from service.api.oip.metadata import has_tensors
from service.errors import ControlOffError, ForbiddenError, InvalidInputError, ModelNotFoundError
from service.inference import InferenceService, ModelState
from service.metadata import RequestMeta

NO_TENSORS = "its task has no tensors on the v2 protocol"


def index(core: InferenceService, meta: RequestMeta, ready_only: bool) -> list[ModelState]:
    """Every model folder and served model with its state that the caller may know of (``core.repository``:
    a key with a model list sees only those); ``ready_only``: those that answer now."""
    out = []
    for state in core.repository(meta):
        if state.state == "READY":
            try:
                if not has_tensors(core.model(meta, state.name)):
                    state = replace(state, state="UNAVAILABLE", reason=NO_TENSORS)
            except ModelNotFoundError:  # unloaded since the index was read
                continue
        if not ready_only or state.state == "READY":
            out.append(state)
    return out


@dataclass(frozen=True)
class Control:
    """A control call's caller: the service's mode, who may call, and the key this caller presented."""

    mode: str  # MODEL_CONTROL_MODE
    access: ControlAccess
    presented: bytes

    def check(self) -> None:
        if self.mode == "none":
            raise ControlOffError("repository control is off: MODEL_CONTROL_MODE=none")
        if self.mode == "poll":
            raise ForbiddenError(
                "MODEL_CONTROL_MODE=poll: the repository's folders decide what serves; load and unload are "
                "refused"
            )
        self.access.check(self.presented)


async def load(core: InferenceService, control: Control, name: str, parameters: Mapping[str, Any]) -> None:
    """Load, or reload, model ``name`` from its folder of the repository."""
    control.check()
    for key in parameters:
        if key == "config" or key.startswith("file:"):
            raise InvalidInputError(
                f"parameter {key!r} is not taken: a model loads from its own folder of the repository",
                f"parameters.{key}",
                "unsupported",
            )
    await core.load(name)


async def unload(core: InferenceService, control: Control, name: str) -> None:
    """Stop serving model ``name``; the requests it has finish first."""
    control.check()
    await core.unload(name)
