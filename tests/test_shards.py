"""The sampled kernel (SHARDS with exact heavy blocks and exact short windows).

Its bookkeeping is checked against the exact twin in the two limits where the answer
is known exactly:

- a reuse window as long as the trace: every evaluated distance is measured exactly,
  so it must equal the exact stack distance;
- a rate so close to 1 that every block is sampled and no window is measured: the
  estimate is the exact distance with the sampled part scaled by 1/R, so it lies
  between the exact distance and the exact distance / R.

Statistical accuracy at realistic rates is measured by benchmarks/curve.py and checked
on a real trace in test_curves.py.
"""

from __future__ import annotations

import numpy as np
import numpy.testing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from strategies import long_traces, random_traces

from kvtrace.kernels.shards import sample_distances

SETTINGS = settings(max_examples=60, deadline=None)


def _request_of(req_start: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(req_start.shape[0] - 1), np.diff(req_start)).astype(np.int64)


def _run(tr, rate, prefix_aware, window):
    m = tr.size.shape[0]
    hashes = np.arange(m, dtype=np.uint64) * np.uint64(2654435761)  # any distinct hashes
    tenants = np.full(m, -1, dtype=np.int32)
    return sample_distances(tr.block, tr.size, tr.req_start, _request_of(tr.req_start), hashes, tenants,
                            rate, prefix_aware, window=window)


def _exact(tr, prefix_aware):
    d, _, _ = naive.stack_distances(tr.block, tr.size, tr.req_start, prefix_aware)
    return np.where(d == naive.COLD, np.inf, d.astype(np.float64))


@SETTINGS
@given(tr=st.one_of(random_traces(), long_traces()), prefix_aware=st.booleans(),
       rate=st.sampled_from([0.05, 0.2, 0.5, 0.9]))
def test_long_window_gives_exact_distances(tr, prefix_aware, rate):
    t, dist, usable, weight, heavy, _ = _run(tr, rate, prefix_aware, window=tr.block.shape[0] + 1)
    exact = _exact(tr, prefix_aware)
    assert np.all(np.diff(t) > 0)
    npt.assert_array_equal(dist, exact[t])
    assert np.all(usable >= dist)
    assert np.all(weight >= 1.0)


@SETTINGS
@given(tr=st.one_of(random_traces(), long_traces()), prefix_aware=st.booleans())
def test_estimate_brackets_exact_distance_when_everything_is_sampled(tr, prefix_aware):
    rate = 1 - 1e-7
    t, dist, _, weight, heavy, code = _run(tr, rate, prefix_aware, window=0)
    exact = _exact(tr, prefix_aware)[t]
    cold = np.isinf(exact)
    npt.assert_array_equal(np.isinf(dist), cold)
    assert np.all(dist[~cold] >= exact[~cold] - 1e-6)
    assert np.all(dist[~cold] <= exact[~cold] / rate + 1e-6)
    # every access is evaluated: sampled blocks all, heavy ones every round(1/R) = 1st
    assert t.shape[0] == tr.block.shape[0]
    npt.assert_allclose(weight, 1.0, rtol=1e-6)


def test_heavy_blocks_are_the_most_accessed():
    # block 0 is in every request; at R = 0.25 a block needs >= 4 accesses to be heavy
    reqs = [[0, 1 + i] for i in range(20)]
    block = np.array([b for r in reqs for b in r], dtype=np.int64)
    size = np.ones(21, dtype=np.int64)
    req_start = np.arange(0, 41, 2, dtype=np.int64)
    t, dist, _, weight, heavy, code = sample_distances(
        block, size, req_start, _request_of(req_start), np.arange(21, dtype=np.uint64),
        np.full(21, -1, dtype=np.int32), 0.25, True)
    assert heavy.tolist() == [0]
    ev0 = t[block[t] == 0]
    assert ev0.tolist() == [0, 8, 16, 24, 32]  # every 4th access of block 0
    npt.assert_allclose(weight[block[t] == 0], 20 / 5)
