"""Which model a request is for, and whether the service knows it: written once, for both kinds of host.

A request names a model (``name[@version]``) or only its task. ``ModelLookup`` answers, over the registry
(what serves) and an ``Offer`` (what the repository holds besides):

- ``target``: the model the request is for: the one it names, else its task's default that serves, else,
  with a memory budget, the folder that would load for the task;
- ``knows``: whether a name is a model of this service at all (resident, refused, or a folder of the
  repository), which is 404 against 503;
- ``loads_on_demand``: whether a request for it would load it (a memory budget, and a folder it may serve).

The engine's ``ModelHost`` reads its ``Offer`` live from the repository (``RepositoryOffer``); a front end's
``RemoteHost`` reads the one the engine last broadcast (``ipc/remote_host.py``), which the engine built
with this same lookup. So the rules live here, and each host only says where its facts come from.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from .loading import Loader
from .memory_budget import MemoryBudget
from .registry import PREFERRED_DEFAULTS, ModelRegistry


class Offer(Protocol):
    """What the repository holds beyond what serves."""

    def folders(self) -> Collection[str]:
        """The repository's model folders."""

    def on_demand(self, name: str) -> bool:
        """Whether a request for ``name`` would load it."""

    def default_for(self, task: str) -> str | None:
        """The folder that would load for a request of ``task`` that names no model (None: none would)."""


class NoOffer:
    """The models of start-up, fixed (MODEL_CONTROL_MODE=none, no budget): the repository offers nothing."""

    def folders(self) -> Collection[str]:
        return ()

    def on_demand(self, name: str) -> bool:
        return False

    def default_for(self, task: str) -> str | None:
        return None


class RepositoryOffer:
    """The repository on disk, read when asked: its folders, and with a memory budget, what would load."""

    def __init__(self, loader: Loader, memory: MemoryBudget) -> None:
        self.loader = loader
        self.memory = memory

    def folders(self) -> Collection[str]:
        return self.loader.folders()

    def on_demand(self, name: str) -> bool:
        return self.memory.enabled and self.loader.servable(name)

    def default_for(self, task: str) -> str | None:
        if not self.memory.enabled:
            return None
        return self.loader.default_for(task, PREFERRED_DEFAULTS.get(task))


class ModelLookup:
    def __init__(self, registry: ModelRegistry, offer: Offer) -> None:
        self.registry = registry
        self.offer = offer

    def target(self, model: str | None, task: str | None) -> str | None:
        """The model name a request for ``model`` (``name[@version]``; None: ``task``'s default) is for: the
        default that serves, else, with a budget, the folder that would load for the task (None: none)."""
        if model is not None:
            return model.split("@", 1)[0]
        if task is None:
            return None
        if task in self.registry.defaults:
            return self.registry.defaults[task]
        return self.offer.default_for(task)

    def loads_on_demand(self, name: str) -> bool:
        """Whether a request for ``name`` would load it (a memory budget, and a folder it may serve)."""
        return self.offer.on_demand(name)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a model of this service: resident, refused, or a folder of the repository."""
        return name in self.registry.versions or name in self.registry.refused or name in self.offer.folders()
