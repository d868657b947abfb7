"""Dependency providers: handlers get the services from app.state, never from module globals."""

from __future__ import annotations

from typing import cast

from litestar.datastructures import State

from service.inference.service import InferenceService
from service.settings import Settings

from .limits import RequestLimits


def provide_inference(state: State) -> InferenceService:
    return cast(InferenceService, state.inference)


def provide_limits(state: State) -> RequestLimits:
    return cast(RequestLimits, state.limits)


def provide_settings(state: State) -> Settings:
    return cast(Settings, state.settings)
