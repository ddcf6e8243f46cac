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

from kvtrace.kernels.shards import _rank, sample_distances, tracked_blocks

SETTINGS = settings(max_examples=60, deadline=None)


def _request_of(req_start: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(req_start.shape[0] - 1), np.diff(req_start)).astype(np.int64)


def _run(tr, rate, prefix_aware, window):
    m = tr.size.shape[0]
    hashes = np.arange(m, dtype=np.uint64) * np.uint64(2654435761)  # any distinct hashes
    tenants = np.full(m, -1, dtype=np.int32)
    return sample_distances(tr.block, tr.size, tr.req_start, hashes, tenants, rate, prefix_aware,
                            window=window)[0]


def _exact(tr, prefix_aware):
    d, _, _ = naive.stack_distances(tr.block, tr.size, tr.req_start, prefix_aware)
    return np.where(d == naive.COLD, np.inf, d.astype(np.float64))


@SETTINGS
@given(tr=st.one_of(random_traces(), long_traces()), prefix_aware=st.booleans(),
       rate=st.sampled_from([0.05, 0.2, 0.5, 0.9]))
def test_long_window_gives_exact_distances(tr, prefix_aware, rate):
    smp = _run(tr, rate, prefix_aware, window=tr.block.shape[0] + 1)
    t, dist, usable, weight = smp.t, smp.dist, smp.usable, smp.weight
    exact = _exact(tr, prefix_aware)
    assert np.all(np.diff(t) > 0)
    npt.assert_array_equal(dist, exact[t])
    assert np.all(usable >= dist)
    assert np.all(weight >= 1.0)


@SETTINGS
@given(tr=st.one_of(random_traces(), long_traces()), prefix_aware=st.booleans())
def test_estimate_brackets_exact_distance_when_everything_is_sampled(tr, prefix_aware):
    rate = 1 - 1e-7
    smp = _run(tr, rate, prefix_aware, window=0)
    t, dist, weight = smp.t, smp.dist, smp.weight
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
    smp, heavy = sample_distances(block, size, req_start, np.arange(21, dtype=np.uint64),
                                  np.full(21, -1, dtype=np.int32), 0.25, True)
    t, weight = smp.t, smp.weight
    assert heavy.tolist() == [0]
    # every 4th access of block 0 (at t = 0, 2, 4, ...), from a phase in 0..3 set by its hash
    ev0 = t[block[t] == 0]
    assert ev0.shape[0] == 5 and np.all(np.diff(ev0) == 8) and ev0[0] in (0, 2, 4, 6)
    npt.assert_array_equal(weight[block[t] == 0], 4.0)
    assert smp.heavy.tolist() == (block[t] == 0).tolist()


def _mix_reference(h: int, ns: int) -> int:
    """splitmix64 finaliser over the hash xor'ed with a spread namespace code (Python ints)."""
    m = (1 << 64) - 1
    x = h ^ (((ns + 1) * 0x9E3779B97F4A7C15) & m)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


@SETTINGS
@given(m=st.integers(1, 700), rate=st.sampled_from([0.01, 0.1, 0.5, 1 - 1e-7]), seed=st.integers(0, 2**32 - 1),
       n_heavy=st.integers(0, 5))
def test_tracked_blocks_are_the_sampled_and_heavy_ones_with_their_ranks(m, rate, seed, n_heavy):
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**63, size=m, dtype=np.int64).astype(np.uint64)
    tenants = rng.integers(-1, 3, size=m).astype(np.int32)
    heavy = np.sort(rng.choice(m, size=min(n_heavy, m), replace=False)).astype(np.int64)
    threshold = int(rate * (1 << 24) + 0.5)
    words, cum, ids = tracked_blocks(hashes, tenants, heavy, np.uint64(threshold))
    want = [b for b in range(m)
            if (_mix_reference(int(hashes[b]), int(tenants[b])) >> 40) < threshold or b in set(heavy.tolist())]
    assert ids.tolist() == want
    # the bitmap's bytes are numpy's little-endian packbits of the membership
    member = np.zeros(m, dtype=bool)
    member[want] = True
    npt.assert_array_equal(words.view(np.uint8)[: (m + 7) // 8], np.packbits(member, bitorder="little"))
    assert [_rank(words, cum, b) for b in want] == list(range(len(want)))


@SETTINGS
@given(tr=st.one_of(random_traces(), long_traces()), prefix_aware=st.booleans(),
       rate=st.sampled_from([0.05, 0.3, 0.9]))
def test_per_access_fields_describe_the_evaluated_accesses(tr, prefix_aware, rate):
    m = tr.size.shape[0]
    smp, heavy = sample_distances(tr.block, tr.size, tr.req_start, np.arange(m, dtype=np.uint64) * np.uint64(2654435761),
                                  np.full(m, -1, dtype=np.int32), rate, prefix_aware, window=8)
    request = _request_of(tr.req_start)
    npt.assert_array_equal(smp.block, tr.block[smp.t])
    npt.assert_array_equal(smp.size, tr.size[tr.block[smp.t]])
    npt.assert_array_equal(smp.request, request[smp.t])
    npt.assert_array_equal(smp.heavy, np.isin(smp.block, heavy))
    # one tracked index per block
    pairs = set(zip(smp.block.tolist(), smp.tracked_index.tolist()))
    assert len({b for b, _ in pairs}) == len(pairs) == len({c for _, c in pairs})
    # the usable estimate is the running max of the estimates along each request
    for r in np.unique(smp.request):
        sel = smp.request == r
        npt.assert_array_equal(smp.usable[sel], np.maximum.accumulate(smp.dist[sel]))


@SETTINGS
@given(tr=st.one_of(random_traces(), long_traces()), prefix_aware=st.booleans(),
       rate=st.sampled_from([0.05, 0.3, 0.9]), window=st.sampled_from([0, 3, 12]), data=st.data())
def test_feeding_in_chunks_equals_one_pass(tr, prefix_aware, rate, window, data):
    # the state carried between chunks (incl. the block ids an exact window reaches
    # back into) makes a streamed pass equal to the in-memory one bit for bit
    m = tr.size.shape[0]
    n_req = tr.req_start.shape[0] - 1
    cuts = data.draw(st.lists(st.integers(1, max(1, n_req - 1)), max_size=6))
    args = (tr.block, tr.size, tr.req_start, np.arange(m, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15),
            np.zeros(m, dtype=np.int32), rate, prefix_aware)
    whole, heavy = sample_distances(*args, window=window)
    parts, heavy2 = sample_distances(*args, window=window, chunks=cuts)
    npt.assert_array_equal(heavy, heavy2)
    for name in whole._fields:
        npt.assert_array_equal(getattr(parts, name), getattr(whole, name), err_msg=name)


def test_exact_window_reads_the_head_of_a_long_request_before_the_chunk():
    # request 0 holds blocks 0..99; request 1 (the next chunk) reuses block 5: in the
    # prefix-aware model only blocks 0..4 were touched after it, so its distance is 6,
    # measured exactly (window 12) from the head of request 0, far behind the chunk
    block = np.array(list(range(100)) + [5], dtype=np.int64)
    req_start = np.array([0, 100, 101], dtype=np.int64)
    size = np.ones(100, dtype=np.int64)
    args = (block, size, req_start, np.arange(100, dtype=np.uint64), np.zeros(100, dtype=np.int32), 1 - 1e-7, True)
    for chunks in (None, [1]):
        smp, _ = sample_distances(*args, window=12, chunks=chunks)
        assert smp.t[-1] == 100 and smp.dist[-1] == 6.0
