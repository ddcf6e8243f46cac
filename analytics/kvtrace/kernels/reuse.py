"""Previous and next access of the same block (O(N), O(M) state)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import NJIT


@njit(**NJIT)
def previous_access(block, n_blocks):
    """int64[N]: index of the previous access of the same block (-1 for a first access)."""
    last = np.full(n_blocks, -1, dtype=np.int64)
    out = np.empty(block.shape[0], dtype=np.int64)
    for t in range(block.shape[0]):
        b = block[t]
        out[t] = last[b]
        last[b] = t
    return out


@njit(**NJIT)
def next_access(block, n_blocks):
    """int64[N]: index of the next access of the same block (-1 for a last access)."""
    nxt = np.full(n_blocks, -1, dtype=np.int64)
    out = np.empty(block.shape[0], dtype=np.int64)
    for t in range(block.shape[0] - 1, -1, -1):
        b = block[t]
        out[t] = nxt[b]
        nxt[b] = t
    return out
