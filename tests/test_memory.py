"""Huge-page tables (kvtrace.kernels.memory): size, alignment, contents, lifetime."""

from __future__ import annotations

import gc

import numpy as np

from kvtrace.kernels.memory import HUGE_PAGE, MIN_HUGE_BYTES, empty_table, zeros_table


def test_small_tables_are_cache_line_aligned():
    for n in (0, 1, 63, 64, 1000, MIN_HUGE_BYTES - 1):
        t = empty_table(n)
        assert t.shape == (n,) and t.dtype == np.uint8
        assert n == 0 or t.ctypes.data % 64 == 0
        t[:] = 7
        assert (t == 7).all()


def test_large_tables_start_on_a_huge_page_and_are_writable():
    n = MIN_HUGE_BYTES + 12345
    t = empty_table(n)
    assert t.shape == (n,)
    assert t.ctypes.data % HUGE_PAGE == 0
    rows = t[: (n // 64) * 64].view(np.int32).reshape(-1, 4, 4)
    rows[:, 1, 2] = np.arange(rows.shape[0], dtype=np.int32)
    assert rows[-1, 1, 2] == rows.shape[0] - 1


def test_zeros_table_is_zero_and_outlives_the_mapping_handle():
    t = zeros_table(MIN_HUGE_BYTES)
    gc.collect()  # only the view refers to the mapping now
    assert not t.any()
    t[-1] = 1
    assert t.sum() == 1
