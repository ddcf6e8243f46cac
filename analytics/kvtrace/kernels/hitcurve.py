"""Hit sums at many capacities in one pass over per-access distances.

Access ``t`` hits a cache of ``grid[k]`` tokens iff ``key[t] <= grid[k]``. The kernel
bins each access at the first grid capacity that holds it (binary search) and
accumulates its weights there; a cumulative sum over the bins then gives, exactly, the
hit sums at every grid capacity. Keys equal to COLD (int64 max) never hit.

Weights per access (columns of the result): 0 = accesses, 1 = tokens of the access,
2 = tokens the block occupies (its cache size), 3 = the position-token sum
``q = k*s + k*(k-1)/2`` of its ``k`` tokens starting at prompt position ``s`` (prefill
FLOPs of the block = a*k + b*q for a model's coefficients a, b).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import NJIT

N_WEIGHTS = 4


@njit(**NJIT)
def _weights(t, tokens, pos, block, size, block_tokens, out):
    k = np.float64(tokens[t])
    s = np.float64(pos[t]) * block_tokens
    out[0] = 1.0
    out[1] = k
    out[2] = np.float64(size[block[t]])
    out[3] = k * s + k * (k - 1.0) * 0.5


@njit(**NJIT)
def binned_hits(keys, first, tokens, pos, block, size, block_tokens, group, n_groups, grid):
    """Per-bin weight sums for accesses ``first..N-1``.

    Parameters
    ----------
    keys : int64[N]
        Distance per access in tokens (COLD = never hits).
    first : int
        First counted access (accesses before it only warmed the cache).
    group : int32[N] or empty
        Group index per access (empty = one group).
    grid : int64[G]
        Capacities in tokens, ascending.

    Returns
    -------
    float64[n_groups, G + 1, N_WEIGHTS]
        Bin G collects accesses that hit at no grid capacity (incl. cold ones); the
        cumulative sum over axis 1 gives hit sums at each grid capacity.
    """
    G = grid.shape[0]
    out = np.zeros((n_groups, G + 1, N_WEIGHTS), dtype=np.float64)
    w = np.empty(N_WEIGHTS, dtype=np.float64)
    grouped = group.shape[0] > 0
    for t in range(first, keys.shape[0]):
        key = keys[t]
        lo = 0
        hi = G
        while lo < hi:  # first grid index with grid >= key
            mid = (lo + hi) >> 1
            if grid[mid] < key:
                lo = mid + 1
            else:
                hi = mid
        g = group[t] if grouped else 0
        _weights(t, tokens, pos, block, size, block_tokens, w)
        for j in range(N_WEIGHTS):
            out[g, lo, j] += w[j]
    return out


@njit(**NJIT)
def keys_in_range(keys, first, tokens, pos, block, size, block_tokens, lo_key, hi_key, a, b, weight):
    """Keys in (lo_key, hi_key] with their weight, for refining an exact capacity.

    ``weight``: 0 accesses, 1 tokens, 2 block tokens, 3 prefill FLOPs (a*k + b*q).
    """
    n = 0
    for t in range(first, keys.shape[0]):
        if lo_key < keys[t] <= hi_key:
            n += 1
    out_k = np.empty(n, dtype=np.int64)
    out_w = np.empty(n, dtype=np.float64)
    w = np.empty(N_WEIGHTS, dtype=np.float64)
    i = 0
    for t in range(first, keys.shape[0]):
        if lo_key < keys[t] <= hi_key:
            _weights(t, tokens, pos, block, size, block_tokens, w)
            out_k[i] = keys[t]
            out_w[i] = a * w[1] + b * w[3] if weight == 3 else w[weight]
            i += 1
    return out_k, out_w
