"""The parity helpers themselves: a lenient helper would silently weaken every parity test that uses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from parity import check_close, check_outputs_equal


def test_equal_outputs_pass() -> None:
    check_outputs_equal([[1, 2], [3]], [[1, 2], [3]], name_a="cached", name_b="recomputed")
    check_outputs_equal([], [], name_a="cached", name_b="recomputed")


def test_a_differing_item_fails_and_shows_both_runs_at_its_index() -> None:
    with pytest.raises(AssertionError) as failure:
        check_outputs_equal(
            [[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]], name_a="cached", name_b="recomputed"
        )
    message = str(failure.value)
    assert "differ at 1 of 2" in message
    assert "[1] first differs at position 1" in message
    assert "cached      [4, 5, 6]" in message and "recomputed  [4, 9, 6]" in message
    assert "[0]" not in message  # equal items are not listed


def test_a_missing_item_fails_even_when_the_common_ones_agree() -> None:
    with pytest.raises(
        AssertionError, match=r"batched has 3 outputs, alone has 2(.|\n)*\[2\] only in batched: 'c'"
    ):
        check_outputs_equal(["a", "b", "c"], ["a", "b"], name_a="batched", name_b="alone")


def test_close_arrays_pass_within_atol_plus_rtol_times_expected() -> None:
    expected = np.array([1.0, 100.0], dtype=np.float32)
    check_close(
        expected + np.array([1e-4, 1e-2], np.float32),
        expected,
        atol=1e-4,
        rtol=1e-4,
        name_a="onnx",
        name_b="torch",
    )
    check_close(torch.ones(2, 3), np.ones((2, 3), np.float32), atol=0, rtol=0, name_a="torch", name_b="numpy")


def test_a_value_past_the_tolerance_fails_and_names_where_and_both_values() -> None:
    expected = np.zeros((2, 3), dtype=np.float32)
    actual = expected.copy()
    actual[1, 2] = 0.5
    actual[0, 1] = 2e-4
    with pytest.raises(AssertionError) as failure:
        check_close(actual, expected, atol=1e-4, name_a="cuda", name_b="cpu")
    message = str(failure.value)
    assert "2 of 6 values differ by more than atol=0.0001 + rtol=1e-07 * |cpu|" in message
    assert "max abs diff 0.5 at index (1, 2): cuda=0.5, cpu=0" in message
    assert "(0, 1)" in message


def test_the_default_rtol_is_assert_allclose_s_and_an_explicit_zero_means_atol_alone() -> None:
    with pytest.raises(AssertionError):
        check_close([100.0 + 1.5e-5], [100.0], atol=1e-5, rtol=0, name_a="a", name_b="b")
    check_close(
        [100.0 + 1.5e-5], [100.0], atol=1e-5, name_a="a", name_b="b"
    )  # 1e-5 + 1e-7 * 100 = 2e-5 allows it


def test_nan_and_shape_mismatches_fail() -> None:
    with pytest.raises(AssertionError, match="differ"):
        check_close([np.nan], [np.nan], atol=1.0, name_a="a", name_b="b")
    with pytest.raises(AssertionError, match=r"a has shape \(2,\), b has shape \(1, 2\)"):
        check_close(np.zeros(2), np.zeros((1, 2)), atol=1.0, name_a="a", name_b="b")
