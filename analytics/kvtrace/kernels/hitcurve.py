"""Hit sums at many capacities in one pass over per-access distances.

Access ``t`` hits a cache of ``grid[k]`` tokens iff ``key[t] <= grid[k]``. The kernel
bins each access at the first grid capacity that holds it (binary search) and
accumulates its weights there; a cumulative sum over the bins then gives, exactly, the
hit sums at every grid capacity. Bin ``G`` holds accesses with a finite key above the
grid, bin ``G + 1`` cold ones (key COLD = int64 max), so the infinite-capacity ceiling
is the sum of bins ``0..G``.

Weights per access (last axis of the result): 0 = accesses, 1 = tokens of the access,
2 = tokens the block occupies (its cache size), 3 = the position-token sum
``q = k*s + k*(k-1)/2`` of its ``k`` tokens starting at prompt position ``s`` (prefill
FLOPs of the block = a*k + b*q for a model's coefficients a, b).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE
from kvtrace.kernels.bits import bit_length

N_WEIGHTS = 4
COLD = np.iinfo(np.int64).max


@njit(**NJIT)
def _bin(grid, key):
    """Index of the first grid capacity >= key (G if none, G+1 if cold)."""
    G = grid.shape[0]
    if key == COLD:
        return G + 1
    lo = 0
    hi = G
    while lo < hi:
        mid = (lo + hi) >> 1
        if grid[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


# Key buckets for the bin lookup: keys below 2**_SUB_BITS are their own bucket; above,
# a bucket is a key's octave and its next _SUB_BITS bits (256 buckets per octave).
_SUB_BITS = 8
_N_BUCKETS = (1 << _SUB_BITS) * (64 - _SUB_BITS + 1)


@njit(**NJIT_INLINE)
def _bucket(key):
    """Bucket of a key >= 0: the key itself below 256, else 256 x (octave - 7) + the
    8 bits after the leading one."""
    if key < (1 << _SUB_BITS):
        return key
    e = bit_length(key) - 1
    return ((e - _SUB_BITS + 1) << _SUB_BITS) + ((key >> (e - _SUB_BITS)) & ((1 << _SUB_BITS) - 1))


@njit(**NJIT)
def _bucket_starts(grid):
    """The bin lookup's tables: for each key bucket the bin of its smallest key, the
    grid padded with one COLD sentinel, and the most grid points inside one bucket
    (a lookup then takes that many branch-free steps instead of a binary search of
    the whole grid)."""
    G = grid.shape[0]
    starts = np.empty(_N_BUCKETS + 1, dtype=np.int64)
    for u in range(_N_BUCKETS):
        if u < (1 << _SUB_BITS):
            low = np.int64(u)
        else:
            e = (u >> _SUB_BITS) + _SUB_BITS - 1
            low = ((np.int64(1) << _SUB_BITS) + (u & ((1 << _SUB_BITS) - 1))) << (e - _SUB_BITS)
        starts[u] = _bin(grid, low) if low >= 0 else G
    starts[_N_BUCKETS] = G
    steps = 0
    for u in range(_N_BUCKETS):
        steps = max(steps, starts[u + 1] - starts[u])
    padded = np.empty(G + 1, dtype=np.int64)
    padded[:G] = grid
    padded[G] = COLD
    return starts, padded, steps


@njit(**NJIT_INLINE)
def _bin_fast(G, padded, starts, steps, key):
    """:func:`_bin` via the bucket tables (:func:`_bucket_starts`) of a grid of
    capacities >= 0: the bucket's first bin, then ``steps`` compare-and-add steps over
    the grid points inside the bucket (no data-dependent branch: whether a key is cold
    or how many grid points it passes is not predictable). A key <= 0 takes bucket 0,
    whose first bin is the first capacity >= 0, i.e. bin 0. A cold key's bucket starts
    at G (no capacity reaches COLD), so adding ``key == COLD`` gives its bin G + 1.

    One exit and no call: a branch to the plain binary search for keys <= 0 (a call
    on a slice of ``padded``), inlined into a loop, slows every lookup, taken or not."""
    i = starts[_bucket(key if key > 0 else np.int64(0))]
    for _ in range(steps):
        i += np.int64(padded[i] < key)
    return i + np.int64(key == COLD)


@njit(**NJIT)
def binned_hits_into(out, keys_any, keys_prefix, first, tokens, pos, block, size, block_tokens, group, grid, scale):
    """Add the per-bin weight sums of accesses ``first..N-1`` into ``out``, for two
    keys in one pass.

    Called on successive chunks of one stream with the same ``out``, it performs the
    same additions in the same order as one call over the whole stream, so the sums
    do not depend on the chunking (every curve pass relies on this).

    Parameters
    ----------
    out : float64[2, n_groups, G + 2, N_WEIGHTS]
        ``[0]`` for ``keys_any``, ``[1]`` for ``keys_prefix``; added to in place.
    keys_any, keys_prefix : int64[N]
        Distances in tokens (any-block and usable-prefix; COLD never hits).
    first : int
        First measured access (earlier ones only warmed the cache).
    tokens, pos : int32[N]
        Tokens of each access and its block's position in the request.
    block : int64[N]
        Block of each access, an index into ``size`` (tokens each block occupies).
    group : int32[N] or empty
        Group index per access (empty = one group).
    grid : int64[G]
        Capacities in tokens, ascending.
    scale : float64[N] or empty
        Per-access multiplier of every weight (sampling weights); empty = 1.
    """
    grouped = group.shape[0] > 0
    scaled = scale.shape[0] > 0
    bt = np.float64(block_tokens)
    starts, padded, steps = _bucket_starts(grid)
    G = grid.shape[0]
    for t in range(first, keys_any.shape[0]):
        g = group[t] if grouped else 0
        w0 = scale[t] if scaled else 1.0
        k = np.float64(tokens[t])
        s = np.float64(pos[t]) * bt
        w1 = w0 * k
        w2 = w0 * np.float64(size[block[t]])
        w3 = w0 * (k * s + k * (k - 1.0) * 0.5)
        i = _bin_fast(G, padded, starts, steps, keys_any[t])
        out[0, g, i, 0] += w0
        out[0, g, i, 1] += w1
        out[0, g, i, 2] += w2
        out[0, g, i, 3] += w3
        # the usable key is a running max: mostly equal to the any-block key
        j = i if keys_prefix[t] == keys_any[t] else _bin_fast(G, padded, starts, steps, keys_prefix[t])
        out[1, g, j, 0] += w0
        out[1, g, j, 1] += w1
        out[1, g, j, 2] += w2
        out[1, g, j, 3] += w3


@njit(**NJIT)
def keys_in_ranges(keys, first, tokens, pos, block_tokens, lo_keys, hi_keys, scale):
    """Keys of the accesses falling in one of the key ranges ``(lo_keys[i], hi_keys[i]]``
    (sorted, disjoint, few), with the range index, tokens and position-token sum
    (times ``scale`` when given): the raw material for an exact capacity between two
    grid points. A key's range is a binary search over the ranges' edges
    (:func:`_range_of`)."""
    n_ranges = lo_keys.shape[0]
    scaled = scale.shape[0] > 0
    bt = np.float64(block_tokens)
    edges = np.empty(2 * n_ranges, dtype=np.int64)
    for i in range(n_ranges):
        edges[2 * i] = lo_keys[i]
        edges[2 * i + 1] = hi_keys[i]
    lo_all = lo_keys[0] if n_ranges else 0
    hi_all = hi_keys[n_ranges - 1] if n_ranges else 0
    n = 0
    for t in range(first, keys.shape[0]):
        k = keys[t]
        if lo_all < k <= hi_all and _range_of(edges, k) >= 0:
            n += 1
    out_k = np.empty(n, dtype=np.int64)
    out_r = np.empty(n, dtype=np.int64)
    out_tok = np.empty(n, dtype=np.float64)
    out_q = np.empty(n, dtype=np.float64)
    j = 0
    for t in range(first, keys.shape[0]):
        k = keys[t]
        if lo_all < k <= hi_all:
            i = _range_of(edges, k)
            if i >= 0:
                w0 = scale[t] if scaled else 1.0
                kk = np.float64(tokens[t])
                s = np.float64(pos[t]) * bt
                out_k[j] = k
                out_r[j] = i
                out_tok[j] = w0 * kk
                out_q[j] = w0 * (kk * s + kk * (kk - 1.0) * 0.5)
                j += 1
    return out_k, out_r, out_tok, out_q


@njit(**NJIT_INLINE)
def _range_of(edges, k):
    """Index i of the range ``(edges[2i], edges[2i + 1]]`` holding ``k`` (not COLD), or
    -1: the count of edges below ``k`` (:func:`_bin`) is odd exactly inside a range."""
    below = _bin(edges, k)
    return (below - 1) >> 1 if below & 1 else -1


@njit(**NJIT)
def binned_requests(keys, members, weights, group, n_groups, grid):
    """Requests per bin of ``grid``, float64[n_groups, G + 2]: each member request's
    key binned as :func:`binned_hits_into` bins an access's (bin G: a finite key above
    the grid, G + 1: COLD), weighted by ``weights`` (empty: 1), by ``group`` (empty: one
    group). Added in request order."""
    G = grid.shape[0]
    out = np.zeros((n_groups, G + 2), dtype=np.float64)
    grouped = group.shape[0] > 0
    weighted = weights.shape[0] > 0
    starts, padded, steps = _bucket_starts(grid)
    for r in range(keys.shape[0]):
        if members[r]:
            i = _bin_fast(G, padded, starts, steps, keys[r])
            out[group[r] if grouped else 0, i] += weights[r] if weighted else 1.0
    return out


@njit(**NJIT)
def max_finite(keys, first):
    """Largest key other than COLD among accesses ``first..`` (-1 when none)."""
    top = np.int64(-1)
    for t in range(first, keys.shape[0]):
        k = keys[t]
        top = max(top, k if k != COLD else np.int64(-1))  # branch-free: a select and a max
    return top
