"""Spatial partitions of the block key space (distributed curves).

Block ``(hash, namespace)`` goes to partition ``floor(u * P / 2^24)`` where ``u`` is
the top 24 bits of the same splitmix64 mix that keys dense ids and the SHARDS sample
(:func:`kvtrace.kernels.densify.mix_hash`). Partition 0 therefore holds exactly the blocks
a SHARDS sample at rate 1/P keeps (``u < 2^24 / P``), and every partition is such a
sample of another slice of the key space: disjoint, covering every block, each block
with all of its accesses.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.densify import mix_hash


@njit(**NJIT)
def partition_of(hashes, ns, n_parts):
    """int32 partition 0..n_parts-1 of each access's block (see the module docstring)."""
    out = np.empty(hashes.shape[0], dtype=np.int32)
    for t in range(hashes.shape[0]):
        u = mix_hash(hashes[t], ns[t]) >> np.uint64(40)
        out[t] = np.int32((u * np.uint64(n_parts)) >> np.uint64(24))
    return out


@njit(**NJIT)
def partition_estimates(dist, size, block, n_parts):
    """Distance estimates of a partition's accesses, in tokens (COLD stays COLD).

    ``dist`` is the exact stack distance inside the partition's own stream:
    ``size[b]`` + the sizes of the partition's other blocks touched since ``b``'s
    previous touch. Each of the trace's other distinct blocks in that window is in the
    partition with probability 1/P, so ``size[b] + P x (dist - size[b])`` is an
    unbiased estimate of the whole trace's distance (``b``'s own size is exact).
    """
    cold = np.iinfo(np.int64).max
    out = np.empty(dist.shape[0], dtype=np.int64)
    for t in range(dist.shape[0]):
        d = dist[t]
        if d == cold:
            out[t] = cold
        else:
            s = size[block[t]]
            out[t] = s + n_parts * (d - s)
    return out
