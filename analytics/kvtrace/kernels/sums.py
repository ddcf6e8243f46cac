"""Float sums fed chunk by chunk that equal numpy's whole-array sums bit for bit.

A float sum depends on the order of its additions. A streamed run sees an array one
chunk at a time but must report the sums an in-memory run computes over the whole
array, so these kernels reproduce numpy's orders exactly:

- ``np.bincount(idx, weights=w)`` adds ``w[i]`` into ``out[idx[i]]`` one by one in
  index order, starting from 0.0: :func:`add_at` continues that across chunks.
- ``np.sum(x)`` of a contiguous float64 array is ``0.0 + pairwise(x)``, numpy's
  pairwise summation: a run of at most 128 values is summed with 8 interleaved
  accumulators (fewer than 8 values: one), a longer run is split at half its length
  rounded down to a multiple of 8 and the two halves' sums are added.
  :class:`PairwiseSum` knows the total length in advance, so it walks the same
  split tree while the values arrive in chunks of any size: O(log N) state and one
  run of at most 128 values.

The twins are numpy itself: ``tests/test_value_stream.py`` compares both with numpy
on many lengths and chunkings.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE

_RUN = 128  # numpy's PW_BLOCKSIZE
_DEPTH = 64  # split levels: > log2(2**63 / 64)


@njit(**NJIT)
def add_at(out, index, weights):
    """``out[index[i]] += weights[i]`` for i in order (``np.bincount``'s order)."""
    for i in range(index.shape[0]):
        out[index[i]] += weights[i]


@njit(**NJIT)
def count_at(out, index, mask):
    """``out[index[i]] += 1`` where ``mask[i]`` (an integer bincount of a mask)."""
    for i in range(index.shape[0]):
        if mask[i]:
            out[index[i]] += 1


@njit(**NJIT_INLINE)
def _half(n):
    n2 = n // 2
    return n2 - n2 % 8


@njit(**NJIT_INLINE)
def _run_sum(buf, n):
    """numpy's ``pairwise_sum`` of a run of n <= 128 values."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += buf[i]
        return res
    r0, r1, r2, r3 = buf[0], buf[1], buf[2], buf[3]
    r4, r5, r6, r7 = buf[4], buf[5], buf[6], buf[7]
    i = 8
    while i < n - n % 8:
        r0 += buf[i]
        r1 += buf[i + 1]
        r2 += buf[i + 2]
        r3 += buf[i + 3]
        r4 += buf[i + 4]
        r5 += buf[i + 5]
        r6 += buf[i + 6]
        r7 += buf[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += buf[i]
        i += 1
    return res


@njit(**NJIT_INLINE)
def _descend(n, state, node_n, node_phase):
    """Push the left spine of the subtree of n values; start its first run."""
    d = state[0]
    while n > _RUN:
        node_n[d] = n
        node_phase[d] = 0
        d += 1
        n = _half(n)
    state[0] = d
    state[1] = n
    state[2] = 0


@njit(**NJIT)
def pairwise_start(n, state, node_n, node_phase):
    """Set up the split tree of a sum of n values (state: depth, run length, filled, done)."""
    state[0] = 0
    state[3] = 0
    if n == 0:
        state[1] = 0
        state[2] = 0
        state[3] = 1
        return
    _descend(n, state, node_n, node_phase)


@njit(**NJIT)
def pairwise_feed(x, state, node_n, node_phase, node_left, buf, out):
    """Feed the next values of the sum; ``out[0]`` holds ``0.0 + pairwise`` when done."""
    for t in range(x.shape[0]):
        f = state[2]
        buf[f] = x[t]
        f += 1
        state[2] = f
        if f < state[1]:
            continue
        v = _run_sum(buf, state[1])
        while True:
            d = state[0]
            if d == 0:
                out[0] = 0.0 + v
                state[3] = 1
                break
            top = d - 1
            if node_phase[top] == 0:
                node_left[top] = v
                node_phase[top] = 1
                n = node_n[top]
                _descend(n - _half(n), state, node_n, node_phase)
                break
            v = node_left[top] + v
            state[0] = top


class PairwiseSum:
    """``np.sum`` of a float64 array of known length ``n``, fed in chunks.

    ``add(chunk)`` with consecutive pieces of the array; after all ``n`` values,
    ``value`` equals ``float(np.sum(whole))`` bit for bit.
    """

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self._fed = 0
        self._state = np.zeros(4, dtype=np.int64)
        self._node_n = np.zeros(_DEPTH, dtype=np.int64)
        self._node_phase = np.zeros(_DEPTH, dtype=np.int64)
        self._node_left = np.zeros(_DEPTH, dtype=np.float64)
        self._buf = np.zeros(_RUN, dtype=np.float64)
        self._out = np.zeros(1, dtype=np.float64)
        pairwise_start(self.n, self._state, self._node_n, self._node_phase)

    def add(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float64)
        if self._fed + x.shape[0] > self.n:
            raise ValueError(f"more than the {self.n} values announced")
        self._fed += x.shape[0]
        pairwise_feed(x, self._state, self._node_n, self._node_phase, self._node_left, self._buf, self._out)

    @property
    def value(self) -> float:
        if self._fed != self.n:
            raise ValueError(f"{self._fed} of {self.n} values fed")
        return float(self._out[0])
