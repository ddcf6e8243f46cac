"""The response model: DESIGN §4's worked example, exactly, and the per-request model."""

from __future__ import annotations

import numpy as np
import numpy.testing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.errors import UsageError
from kvtrace.analyses.response import ResponseModel, branch_latency, percentiles, request_times

MS = 1e-3


def test_design_worked_example():
    # DESIGN §4 (seed §6): h_D 0.80, D 20 ms, R 2000 ms, flash +15 % at F 300 ms, O 20 ms
    r = branch_latency(0.80, 0.15, 20 * MS, 300 * MS, 2000 * MS, 20 * MS)
    assert round(r.dram_only_mean_s / MS, 6) == 416
    assert round(r.tiered_mean_s / MS, 6) == 181
    assert round(r.big_dram_mean_s / MS, 6) == 119
    assert round(r.break_even_flash_s / MS, 1) == 1866.7
    assert round(r.tiered_percentiles_s["p99"] / MS, 6) == 2020
    assert round(r.dram_only_percentiles_s["p99"] / MS, 6) == 2000
    slow = branch_latency(0.80, 0.15, 20 * MS, 2200 * MS, 2000 * MS, 20 * MS)
    assert round(slow.tiered_mean_s / MS, 6) == 466
    # with a restore deadline a flash read slower than recompute is recomputed instead
    assert round(slow.tiered_with_deadline_mean_s / MS, 6) == 436
    assert len(r.explain) == 6 and "1866.7" in r.explain[4]


def test_bad_branch_inputs():
    with pytest.raises(UsageError):
        branch_latency(0.9, 0.2, 0.02, 0.3, 2.0)
    with pytest.raises(UsageError):
        branch_latency(-0.1, 0.2, 0.02, 0.3, 2.0)
    with pytest.raises(UsageError):
        branch_latency(0.5, 0.2, 0.02, -0.3, 2.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e10), st.floats(0, 1e10), st.floats(0, 1e16), st.floats(0, 1e16)),
                min_size=1, max_size=30), st.booleans())
def test_request_times_against_a_per_request_loop(rows, has_flash):
    m = ResponseModel(dram_fixed_s=0.001, dram_bytes_per_s=2e10, flash_fixed_s=0.002, flash_bytes_per_s=5e9,
                      overhead_s=0.003, recompute_flops_per_s=4e14)
    bd, bf, ff, fm = (np.array(c) for c in zip(*rows))
    got = request_times(bd, bf, ff, fm, m, has_flash)
    for i, (d, f, fl_f, fl_m) in enumerate(rows):
        t = (0.001 + d / 2e10) if d > 0 else 0.0
        restore = (0.002 + f / 5e9) if f > 0 else 0.0
        t += min(restore, fl_f / 4e14) + fl_m / 4e14 + (0.003 if has_flash else 0.0)
        assert got[i] == pytest.approx(t, rel=1e-12, abs=1e-15)


def test_percentiles_are_inverted_cdf():
    t = np.array([1.0] * 80 + [3.0] * 15 + [9.0] * 5)
    p = percentiles(t)
    assert p["p50_s"] == 1.0 and p["p90_s"] == 3.0 and p["p99_s"] == 9.0 and p["mean_s"] == pytest.approx(1.7)
    npt.assert_equal(percentiles([])["mean_s"], None)
