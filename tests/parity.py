"""Parity assertions that show both runs when they disagree.

Parity tests compare two ways of computing the same thing (torch and ONNX
Runtime, cached and recomputed decoding, a batch and its items one by one, CUDA
and CPU). A bare `assert a == b` on two lists of token ids says little when it
fails; these helpers print the two runs side by side, index by index, as vLLM's
tests/models/utils.py `check_outputs_equal` does, and for arrays where the
largest difference is and what both sides hold there.

Both keep the strength of the comparison they replace: `check_outputs_equal` is
`==` item by item plus equal lengths (what `==` on two lists means), and
`check_close` is numpy.testing.assert_allclose's rule, |a - b| <= atol + rtol * |b|,
with its default rtol, except that a NaN never matches (not even another NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_SHOWN = 8  # mismatching indices (or array elements) printed at most


def check_outputs_equal(
    outputs_a: Sequence[Any], outputs_b: Sequence[Any], *, name_a: str, name_b: str
) -> None:
    """Assert that two runs gave equal outputs: as many of them, and each pair equal under ``==``."""
    a, b = list(outputs_a), list(outputs_b)
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    if not differ and len(a) == len(b):
        return
    width = max(len(name_a), len(name_b))
    lines = [f"{name_a} and {name_b} differ at {len(differ)} of {min(len(a), len(b))} compared indices"]
    if len(a) != len(b):
        lines[0] += f"; {name_a} has {len(a)} outputs, {name_b} has {len(b)}"
    for i in differ[:_SHOWN]:
        lines.append(f"[{i}]{_first_difference(a[i], b[i])}")
        lines.append(f"  {name_a:<{width}}  {a[i]!r}")
        lines.append(f"  {name_b:<{width}}  {b[i]!r}")
    if len(differ) > _SHOWN:
        lines.append(f"... and {len(differ) - _SHOWN} more: indices {differ[_SHOWN:]}")
    longer, name = (a, name_a) if len(a) > len(b) else (b, name_b)
    for i in range(min(len(a), len(b)), min(len(longer), len(b) + _SHOWN, len(a) + _SHOWN)):
        lines.append(f"[{i}] only in {name}: {longer[i]!r}")
    raise AssertionError("\n".join(lines))


def check_close(
    actual: Any, expected: Any, *, atol: float, rtol: float = 1e-7, name_a: str, name_b: str
) -> None:
    """Assert |actual - expected| <= atol + rtol * |expected| everywhere, on arrays of the same shape.

    Torch tensors are taken as numpy arrays (detached, on the CPU).
    """
    a, b = _numpy(actual), _numpy(expected)
    assert a.shape == b.shape, f"{name_a} has shape {a.shape}, {name_b} has shape {b.shape}"
    close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=False)
    if close.all():
        return
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    far = [tuple(int(k) for k in index) for index in np.argwhere(~close)]  # failing indices, in order
    worst = far[int(np.argmax(np.where(np.isnan(diff[~close]), np.inf, diff[~close])))]
    column = max(len(name_a), len(name_b), 14)
    lines = [
        f"{name_a} and {name_b}: {len(far)} of {a.size} values differ by more than "
        f"atol={atol:g} + rtol={rtol:g} * |{name_b}|",
        f"max abs diff {diff[worst]:.3g} at index {worst}: "
        f"{name_a}={float(a[worst]):.9g}, {name_b}={float(b[worst]):.9g}",
        f"{'index':<16}{name_a:>{column}}  {name_b:>{column}}  abs diff",
    ]
    for index in far[:_SHOWN]:
        lines.append(
            f"{index!s:<16}{float(a[index]):>{column}.9g}  {float(b[index]):>{column}.9g}  {diff[index]:.3g}"
        )
    if len(far) > _SHOWN:
        lines.append(f"... and {len(far) - _SHOWN} more")
    raise AssertionError("\n".join(lines))


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor; this module does not import torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _first_difference(x: Any, y: Any) -> str:
    """Where two sequences (token ids, text) first part, when both are sequences."""
    if not (isinstance(x, (list, tuple, str)) and isinstance(y, (list, tuple, str))):
        return ""
    for k, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return f" first differs at position {k}"
    return f" lengths {len(x)} and {len(y)}, equal up to {min(len(x), len(y))}"
