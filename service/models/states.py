"""A model of the repository as the repository index shows it: what the host knows of each model, with no
import of the host (the inference core and a front end's mirror read it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ModelState:
    """One model of the repository as the repository index shows it (Triton's states)."""

    name: str
    version: str | None
    state: Literal["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]
    reason: str = ""
