"""Stack-distance kernel vs its slow twins in tests/naive.py (DESIGN §2).

Three layers, each checking the next:
- hand-computed cases pin the twins (and the kernel) to the definition;
- ``naive.stack_distances`` vs ``naive.lru_simulate``: a distance is exact iff
  ``dist <= C`` reproduces an explicit byte-LRU at every capacity C;
- the kernel vs both twins on random and degenerate traces, both LRU models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import numpy.testing as npt
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

import naive
from strategies import (
    ChainedTrace,
    Trace,
    any_traces,
    chained_traces,
    long_traces,
    make_trace,
)

from kvtrace.kernels.stackdist import COLD, stack_distances, usable_distances

C = COLD
MODELS = pytest.mark.parametrize("prefix_aware", [False, True], ids=["flat", "prefix"])
SETTINGS = settings(deadline=None, max_examples=150)
FEW = settings(deadline=None, max_examples=40)


# --------------------------------------------------------------------------- helpers


def kernel(trace: Trace, prefix_aware: bool):
    """Run the kernel, checking output types and that the inputs are left untouched."""
    before = [a.copy() for a in trace]
    out = stack_distances(trace.block, trace.size, trace.req_start, prefix_aware)
    for a, b in zip(before, trace):
        npt.assert_array_equal(a, b, err_msg="kernel modified its input")
    assert len(out) == 3
    for a in out:
        assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.shape == trace.block.shape
    return out


def assert_same(got, want, prefix_aware: bool) -> None:
    for name, g, w in zip(("dist", "dist_blocks", "prev_request"), got, want):
        npt.assert_array_equal(g, w, err_msg=f"{name}, prefix_aware={prefix_aware}")


def capacities(trace: Trace, *dists: np.ndarray) -> list[int]:
    """Every capacity where a hit can change (each finite distance and its neighbours),
    plus below the smallest block, between sizes, at the largest block and huge."""
    size = sorted(set(trace.size.tolist())) or [1]
    caps = {0, 1, size[0] - 1, size[0], size[-1] - 1, size[-1], size[-1] + 1,
            int(trace.size.sum()), int(trace.size.sum()) + 1, 2**62}
    caps |= {(a + b) // 2 for a, b in zip(size, size[1:])}
    for dist in dists:
        for d in dist[dist != COLD].tolist():
            caps |= {d - 1, d, d + 1}
    return sorted(c for c in caps if c >= 0)


def request_of(req_start: np.ndarray) -> np.ndarray:
    """Request index of every access."""
    return np.repeat(np.arange(len(req_start) - 1), np.diff(req_start))


def usable_hits(hits: np.ndarray, req_start: np.ndarray) -> np.ndarray:
    """Block j of a request is a usable-prefix hit iff blocks 0..j all hit."""
    out = np.zeros_like(hits)
    for lo, hi in zip(req_start[:-1], req_start[1:]):
        out[lo:hi] = np.logical_and.accumulate(hits[lo:hi])
    return out


def prefix_closed_violation(trace, capacity: int, prefix_aware: bool):
    """First (request, cached block whose trie parent is not cached), or None."""
    _, after = naive.lru_simulate(trace.block, trace.size, trace.req_start, capacity, prefix_aware)
    for r, cached in enumerate(after):
        for b in sorted(cached):
            p = int(trace.parent[b])
            if p >= 0 and p not in cached:
                return r, b
    return None


def any_violation(trace, prefix_aware: bool):
    for cap in capacities(trace, naive.stack_distances(*trace[:3], prefix_aware)[0]):
        v = prefix_closed_violation(trace, cap, prefix_aware)
        if v is not None:
            return cap, v
    return None


# ----------------------------------------------------------- hand-computed cases

# (requests, sizes, prefix_aware, dist, dist_blocks, prev_request)
EXPLICIT = [
    pytest.param([[0, 1, 2, 0]], [1, 2, 4], False,
                 [C, C, C, 7], [C, C, C, 3], [-1, -1, -1, 0], id="flat-reuse-depth"),
    # Inside one request every access sees the state before the request: all cold.
    pytest.param([[0, 1, 2, 0]], [1, 2, 4], True,
                 [C, C, C, C], [C, C, C, C], [-1, -1, -1, -1], id="prefix-repeat-in-cold-request"),
    # flat leaves [1, 0] (1 most recent); prefix touches 1 then 0 and leaves [0, 1].
    pytest.param([[0, 1], [0, 1]], [3, 5], False,
                 [C, C, 8, 8], [C, C, 2, 2], [-1, -1, 0, 0], id="flat-chain"),
    pytest.param([[0, 1], [0, 1]], [3, 5], True,
                 [C, C, 3, 8], [C, C, 1, 2], [-1, -1, 0, 0], id="prefix-chain"),
    # A block repeated inside a request: flat sees its own touch, prefix the old state.
    pytest.param([[0, 0], [0, 1, 0]], [2, 7], False,
                 [C, 2, 2, C, 9], [C, 1, 1, C, 2], [-1, 0, 0, -1, 1], id="flat-repeat"),
    pytest.param([[0, 0], [0, 1, 0]], [2, 7], True,
                 [C, C, 2, C, 2], [C, C, 1, C, 1], [-1, -1, 0, -1, 0], id="prefix-repeat"),
    # Empty requests still count as request indices.
    pytest.param([[], [0, 1], [], [0], []], [1, 1], False,
                 [C, C, 2], [C, C, 2], [-1, -1, 1], id="flat-empty-requests"),
    pytest.param([[], [0, 1], [], [0], []], [1, 1], True,
                 [C, C, 1], [C, C, 1], [-1, -1, 1], id="prefix-empty-requests"),
    # Another request's (giant) block in between.
    pytest.param([[0, 1], [2], [0, 1]], [1, 1, 10], False,
                 [C, C, C, 12, 12], [C, C, C, 3, 3], [-1, -1, -1, 0, 0], id="flat-interleaved"),
    pytest.param([[0, 1], [2], [0, 1]], [1, 1, 10], True,
                 [C, C, C, 11, 12], [C, C, C, 2, 3], [-1, -1, -1, 0, 0], id="prefix-interleaved"),
    pytest.param([[0]], [5], True, [C], [C], [-1], id="one-access"),
    pytest.param([[0], [0], [0, 0]], [9], False, [C, 9, 9, 9], [C, 1, 1, 1], [-1, 0, 1, 2], id="flat-hot"),
    pytest.param([[0], [0], [0, 0]], [9], True, [C, 9, 9, 9], [C, 1, 1, 1], [-1, 0, 1, 1], id="prefix-hot"),
]


@pytest.mark.parametrize("requests, size, prefix_aware, dist, dist_blocks, prev", EXPLICIT)
def test_hand_computed(requests, size, prefix_aware, dist, dist_blocks, prev):
    trace = make_trace(requests, size)
    want = [np.array(x, dtype=np.int64) for x in (dist, dist_blocks, prev)]
    assert_same(naive.stack_distances(*trace, prefix_aware), want, prefix_aware)
    assert_same(kernel(trace, prefix_aware), want, prefix_aware)


def test_cold_is_int64_max():
    assert COLD == naive.COLD == np.iinfo(np.int64).max


@pytest.mark.parametrize("dist, req_start, want", [
    ([5, 3, C, 2], [0, 2, 4], [5, 5, C, C]),
    ([4, C, 1], [0, 3], [4, C, C]),
    ([1, 2, 3], [0, 0, 1, 1, 3], [1, 2, 3]),
    ([7, 2, 9, 1], [0, 4], [7, 7, 9, 9]),
])
def test_usable_hand_computed(dist, req_start, want):
    dist, req_start = np.array(dist, dtype=np.int64), np.array(req_start, dtype=np.int64)
    npt.assert_array_equal(naive.usable_distances(dist, req_start), want)
    npt.assert_array_equal(usable_distances(dist, req_start), want)


def test_lru_simulate_hand_computed():
    # Sizes 3, 5, 4 and a 20-token block that flushes the cache on its way through.
    trace = make_trace([[0, 1], [2], [0], [3], [2]], [3, 5, 4, 20])
    hits, after = naive.lru_simulate(*trace, 8, prefix_aware=False)
    npt.assert_array_equal(hits, [False, False, False, False, False, False])
    assert after == [{0, 1}, {2}, {2, 0}, set(), {2}]
    hits, after = naive.lru_simulate(*trace, 9, prefix_aware=True)
    # prefix: [0, 1] touched 1 then 0 -> cache {0, 1} (8); 2 evicts 1 (LRU) -> {0, 2}
    npt.assert_array_equal(hits, [False, False, False, True, False, False])
    assert after == [{0, 1}, {0, 2}, {0, 2}, set(), {2}]


# -------------------------------------------------------------- degenerate inputs


@MODELS
@pytest.mark.parametrize("n_blocks, req_start", [(0, [0]), (3, [0]), (0, [0, 0, 0]), (2, [0, 0])],
                         ids=["M0-R0", "M3-R0", "M0-R2", "M2-R1"])
def test_empty_trace(prefix_aware, n_blocks, req_start):
    trace = Trace(np.zeros(0, dtype=np.int64), np.ones(n_blocks, dtype=np.int64),
                  np.array(req_start, dtype=np.int64))
    out = kernel(trace, prefix_aware)
    assert_same(out, naive.stack_distances(*trace, prefix_aware), prefix_aware)
    for a in out:
        assert a.shape == (0,)
    u = usable_distances(out[0], trace.req_start)
    assert u.shape == (0,) and u.dtype == np.int64


@MODELS
def test_unused_block_ids(prefix_aware):
    # size may describe blocks the trace never touches (ids only need to be < M).
    trace = make_trace([[3, 1], [1, 3]], [50, 2, 50, 4, 50])
    assert_same(kernel(trace, prefix_aware), naive.stack_distances(*trace, prefix_aware), prefix_aware)


# --------------------------------------------------------- kernel vs naive twin


@MODELS
@SETTINGS
@given(trace=any_traces)
def test_matches_naive(trace, prefix_aware):
    assert_same(kernel(trace, prefix_aware), naive.stack_distances(*trace, prefix_aware), prefix_aware)


@MODELS
@FEW
@given(trace=long_traces())
def test_matches_naive_long(trace, prefix_aware):
    # N >> M: the kernel must renumber (compact) its time axis several times.
    assert len(trace.block) > 2 * len(trace.size) + 64
    assert_same(kernel(trace, prefix_aware), naive.stack_distances(*trace, prefix_aware), prefix_aware)


@MODELS
@SETTINGS
@given(trace=any_traces)
def test_dist_blocks_is_unit_size_dist(trace, prefix_aware):
    dist, dist_blocks, _ = kernel(trace, prefix_aware)
    unit_dist, unit_blocks, _ = kernel(trace._replace(size=np.ones_like(trace.size)), prefix_aware)
    npt.assert_array_equal(dist_blocks, unit_dist)
    npt.assert_array_equal(dist_blocks, unit_blocks)
    # Depth in tokens lies between depth in blocks (sizes >= 1) and blocks x max size.
    warm = dist != COLD
    npt.assert_array_equal(warm, dist_blocks != COLD)
    assert np.all(dist[warm] >= dist_blocks[warm])
    assert np.all(dist[warm] <= dist_blocks[warm] * trace.size.max())
    assert np.all(dist[warm] >= trace.size[trace.block[warm]])


@MODELS
@SETTINGS
@given(trace=any_traces)
def test_prev_request(trace, prefix_aware):
    dist, _, prev = kernel(trace, prefix_aware)
    req = request_of(trace.req_start)
    npt.assert_array_equal(prev == -1, dist == COLD)
    # prev is an earlier request (the same one only for a flat repeat inside it) that
    # really touched the block.
    for t in np.flatnonzero(prev >= 0):
        p = prev[t]
        assert p < req[t] or (p == req[t] and not prefix_aware)
        assert trace.block[t] in trace.block[trace.req_start[p]:trace.req_start[p + 1]]


# ------------------------------------------- distances reproduce an explicit LRU


@MODELS
@SETTINGS
@given(trace=any_traces)
def test_naive_twins_agree(trace, prefix_aware):
    # The two twins check each other: hit at C iff dist <= C, at every capacity.
    dist = naive.stack_distances(*trace, prefix_aware)[0]
    for cap in capacities(trace, dist):
        hits, _ = naive.lru_simulate(*trace, cap, prefix_aware)
        npt.assert_array_equal(dist <= cap, hits, err_msg=f"capacity {cap}")


@MODELS
@SETTINGS
@given(trace=any_traces)
def test_kernel_hits_match_lru(trace, prefix_aware):
    dist = kernel(trace, prefix_aware)[0]
    usable = usable_distances(dist, trace.req_start)
    for cap in capacities(trace, dist, naive.stack_distances(*trace, prefix_aware)[0]):
        hits, _ = naive.lru_simulate(*trace, cap, prefix_aware)
        npt.assert_array_equal(dist <= cap, hits, err_msg=f"capacity {cap}")
        npt.assert_array_equal(usable <= cap, usable_hits(hits, trace.req_start),
                               err_msg=f"usable, capacity {cap}")


@MODELS
@FEW
@given(trace=long_traces(), data=st.data())
def test_kernel_hits_match_lru_long(trace, prefix_aware, data):
    dist = kernel(trace, prefix_aware)[0]
    finite = sorted(set(dist[dist != COLD].tolist())) or [1]
    for cap in {0, int(trace.size.min()), int(trace.size.max()), data.draw(st.sampled_from(finite))}:
        hits, _ = naive.lru_simulate(*trace, cap, prefix_aware)
        npt.assert_array_equal(dist <= cap, hits, err_msg=f"capacity {cap}")


@MODELS
def test_oversize_block_passes_through(prefix_aware):
    # Block 1 (100 tokens) never fits in 10 tokens but flushes block 0 on its way.
    trace = make_trace([[0], [1], [0], [0]], [4, 100])
    dist = kernel(trace, prefix_aware)[0]
    npt.assert_array_equal(dist, [C, C, 104, 4])
    hits, after = naive.lru_simulate(*trace, 10, prefix_aware)
    npt.assert_array_equal(hits, [False, False, False, True])
    assert after == [{0}, set(), {0}, {0}]
    npt.assert_array_equal(dist <= 10, hits)


# ------------------------------------------------------------- usable prefix


@MODELS
@SETTINGS
@given(trace=any_traces)
def test_usable_matches_naive(trace, prefix_aware):
    dist = kernel(trace, prefix_aware)[0]
    usable = usable_distances(dist, trace.req_start)
    assert usable.dtype == np.int64 and usable.shape == dist.shape
    npt.assert_array_equal(usable, naive.usable_distances(dist, trace.req_start))
    assert np.all(usable >= dist)


@SETTINGS
@given(data=st.data())
def test_usable_on_arbitrary_distances(data):
    lengths = data.draw(st.lists(st.integers(0, 6), max_size=8))
    req_start = np.cumsum([0, *lengths]).astype(np.int64)
    values = st.one_of(st.integers(1, 10**6), st.just(COLD))
    dist = np.array(data.draw(st.lists(values, min_size=int(req_start[-1]), max_size=int(req_start[-1]))),
                    dtype=np.int64).reshape(-1)
    usable = usable_distances(dist, req_start)
    npt.assert_array_equal(usable, naive.usable_distances(dist, req_start))
    assert np.all(usable >= dist)


@MODELS
@SETTINGS
@given(trace=chained_traces())
def test_usable_equals_dist_on_chains(trace, prefix_aware):
    # Prefix-aware: a parent is always above its child in the recency stack, so d
    # rises along a chain. Flat: a child above its parent sits right next to it
    # (touched just after it), so d stays level. A cold block has only cold children.
    for dist in (kernel(trace, prefix_aware)[0], naive.stack_distances(*trace[:3], prefix_aware)[0]):
        npt.assert_array_equal(usable_distances(dist, trace.req_start), dist)


def test_usable_differs_from_dist_off_chains():
    # Without chaining (block 1 reused after a new block 0) usable and dist differ,
    # so the test above can fail.
    for prefix_aware, warm in ((False, 5), (True, 3)):
        dist = kernel(make_trace([[1], [0, 1]], [2, 3]), prefix_aware)[0]
        npt.assert_array_equal(dist, [C, C, warm])
        npt.assert_array_equal(usable_distances(dist, np.array([0, 1, 3])), [C, C, C])


# --------------------------------------------------------- prefix-closed cache


@FEW
@given(trace=chained_traces())
def test_prefix_aware_cache_is_prefix_closed(trace):
    assert any_violation(trace, prefix_aware=True) is None


def test_flat_cache_is_not_prefix_closed():
    # The checker does find violations: deterministically search for a flat one.
    example = find(chained_traces(), lambda tr: any_violation(tr, prefix_aware=False) is not None,
                   settings=settings(database=None, derandomize=True, max_examples=2000))
    assert any_violation(example, prefix_aware=True) is None
    # The smallest one: a two-block chain at a capacity holding one block.
    chain = ChainedTrace(*make_trace([[0, 1]], [1, 1]), parent=np.array([-1, 0]))
    assert prefix_closed_violation(chain, 1, prefix_aware=False) == (0, 1)
    assert prefix_closed_violation(chain, 1, prefix_aware=True) is None


# ------------------------------------------------------------------- no JIT

_NO_JIT_SCRIPT = r"""
import json, sys
import numba
import numpy as np
from kvtrace.kernels.stackdist import stack_distances, usable_distances
case = json.load(sys.stdin)
out = {"jit_disabled": bool(numba.config.DISABLE_JIT)}
args = [np.array(case[k], dtype=np.int64) for k in ("block", "size", "req_start")]
for prefix_aware in (False, True):
    dist, dist_blocks, prev = stack_distances(*args, prefix_aware)
    usable = usable_distances(dist, args[2])
    out[str(prefix_aware)] = [a.tolist() for a in (dist, dist_blocks, prev, usable)]
print(json.dumps(out))
"""


def test_kernel_without_jit():
    # Pure-Python run of the same kernel bodies (coverage sees them; a JIT-only
    # behaviour shows up as a difference). Long enough to compact the time axis.
    rng = np.random.default_rng(7)
    requests = [rng.integers(0, 5, size=rng.integers(0, 6)).tolist() for _ in range(60)]
    requests[3] = [0, 0, 1, 0]
    size = [3, 1, 512, 7, 10**6]
    trace = make_trace(requests, size)
    assert len(trace.block) > 2 * len(size) + 64
    case = {k: getattr(trace, k).tolist() for k in ("block", "size", "req_start")}
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    proc = subprocess.run([sys.executable, "-c", _NO_JIT_SCRIPT], input=json.dumps(case),
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["jit_disabled"] is True
    for prefix_aware in (False, True):
        got = [np.array(a, dtype=np.int64) for a in out[str(prefix_aware)]]
        want = list(naive.stack_distances(*trace, prefix_aware))
        want.append(naive.usable_distances(want[0], trace.req_start))
        jit = list(kernel(trace, prefix_aware))
        jit.append(usable_distances(jit[0], trace.req_start))
        for name, g, w, j in zip(("dist", "dist_blocks", "prev_request", "usable"), got, want, jit):
            npt.assert_array_equal(g, w, err_msg=f"no-JIT {name}, prefix_aware={prefix_aware}")
            npt.assert_array_equal(j, w, err_msg=f"JIT {name}, prefix_aware={prefix_aware}")


# --------------------------------------------------------------------------- two halves at once


def in_halves(trace: Trace, prefix_aware: bool, chunk: int):
    """kvtrace.analyses.distances.distances_in_halves over chunks of about ``chunk``
    accesses: (dist, usable, the chunks' starts in the order they were handed over)."""
    from kvtrace.analyses.distances import distances_in_halves
    from kvtrace.trace.source import AccessChunk, request_chunks

    rs = np.asarray(trace.req_start, dtype=np.int64)
    block = np.asarray(trace.block, dtype=np.int64)
    chunks = [AccessChunk(r, r_end, lo, hi, block[lo:hi], None, None, rs[r:r_end + 1] - lo)
              for r, r_end, lo, hi in request_chunks(rs, chunk)]
    n = block.shape[0]
    dist, usable = np.full(n, -7, dtype=np.int64), np.full(n, -7, dtype=np.int64)
    order: list[int] = []
    if chunks:
        distances_in_halves(chunks, np.asarray(trace.size, dtype=np.int64),
                            "prefix-aware" if prefix_aware else "flat", dist, usable, lambda ch: order.append(ch.lo))
    assert order == [ch.lo for ch in chunks]  # every chunk handed over once, in trace order
    return dist, usable


@MODELS
@SETTINGS
@given(trace=st.one_of(any_traces, long_traces()), chunk=st.integers(1, 40))
def test_two_halves_equal_the_naive_twin(trace, prefix_aware, chunk):
    """The later half's own stack and its first touches resolved on the earlier half's
    final stack (kernels.stack_halves) give every distance and usable distance of the
    one-pass twin, whatever the cut."""
    want, _, _ = naive.stack_distances(*trace, prefix_aware)
    dist, usable = in_halves(trace, prefix_aware, chunk)
    npt.assert_array_equal(dist, want)
    npt.assert_array_equal(usable, naive.usable_distances(want, trace.req_start))


@MODELS
@pytest.mark.parametrize("case", ["repeats", "all-early", "all-late", "disjoint"])
def test_two_halves_by_hand(prefix_aware, case):
    """Blocks repeated inside a request of the later half, halves sharing every block,
    none, and a later half made of blocks the earlier half never saw."""
    rng = np.random.default_rng(len(case))
    reqs = {
        "repeats": [[0, 1, 2], [3, 4], [2, 2, 5, 2], [1, 1], [0, 6, 0]],
        "all-early": [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5]],
        "all-late": [[0], [1, 2, 3, 4, 5, 6], [6, 5, 4], [3, 2, 1, 0]],
        "disjoint": [[0, 1], [2, 3], [4, 5], [6, 7]],
    }[case]
    trace = make_trace(reqs, list(rng.integers(1, 9, 8)))
    want, _, _ = naive.stack_distances(*trace, prefix_aware)
    for chunk in (1, 2, 3, 5):
        dist, usable = in_halves(trace, prefix_aware, chunk)
        npt.assert_array_equal(dist, want)
        npt.assert_array_equal(usable, naive.usable_distances(want, trace.req_start))
