"""Bit tricks shared by kernels."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import NJIT_INLINE


@njit(**NJIT_INLINE)
def bit_length(x):
    """Bits of an integer 0 <= x < 2**63 (0 for 0), branch-free: six shift-and-compare
    steps, no table, no memory traffic (callers sit in hot loops whose state a store
    would make the compiler reload)."""
    x = np.int64(x)
    n = np.int64(0)
    k = np.int64(x >= (np.int64(1) << 32)) << 5
    x >>= k
    n += k
    k = np.int64(x >= 65536) << 4
    x >>= k
    n += k
    k = np.int64(x >= 256) << 3
    x >>= k
    n += k
    k = np.int64(x >= 16) << 2
    x >>= k
    n += k
    k = np.int64(x >= 4) << 1
    x >>= k
    n += k
    return n + np.int64(x >= 2) + np.int64(x >= 1)
