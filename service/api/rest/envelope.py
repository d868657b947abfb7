"""The fields every inference response carries beside its results."""

from __future__ import annotations

from typing import Any

from service.api.rest.schemas.common import UsageOut
from service.inference import Outcome


def envelope(outcome: Outcome[Any]) -> dict[str, Any]:
    return {
        "model": outcome.model,
        "model_version": outcome.model_version,
        "cached": outcome.cached,
        "usage": UsageOut.of(outcome.usage),
    }
