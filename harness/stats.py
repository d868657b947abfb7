"""The figures the harnesses report: percentiles, medians and ratios, NaN where there is nothing to measure.

NaN rather than None so that a missing figure still goes through arithmetic and formatting (``p * 1e3``,
``f"{p:.1f}"`` gives ``nan``); ``json_file.write_json`` writes it as null.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100, numpy's default method); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan
