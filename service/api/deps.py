"""Dependency providers: handlers get the services from app.state, never from module globals."""

from __future__ import annotations

from typing import cast

from litestar.datastructures import State

from service.inference.service import InferenceService
from service.metrics import Metrics
from service.settings import Settings

from .limits import RequestLimits


def provide_inference(state: State) -> InferenceService:
    return cast(InferenceService, state.inference)


def provide_limits(state: State) -> RequestLimits:
    return cast(RequestLimits, state.limits)


def provide_settings(state: State) -> Settings:
    return cast(Settings, state.settings)


def provide_metrics(state: State) -> Metrics:
    return cast(Metrics, state.metrics)
