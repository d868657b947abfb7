"""Reports as strict JSON: NaN and infinities (``stats``' "nothing measured") become null."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity, however deep in dicts and lists, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(data), indent=2, allow_nan=False) + "\n")
