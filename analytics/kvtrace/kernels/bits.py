"""Bit tricks shared by kernels."""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import njit
from numba.cpython.unsafe.numbers import leading_zeros

from kvtrace.config import NJIT_INLINE


@njit(**NJIT_INLINE)
def _bit_length_shifts(x):
    """Bits of an integer 0 <= x < 2**63 (0 for 0), branch-free: six shift-and-compare
    steps, no table, no memory traffic (the pure-Python path, where no intrinsic runs)."""
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


@njit(**NJIT_INLINE)
def _bit_length_ctlz(x):
    """Bits of an integer 0 <= x < 2**63 (0 for 0): 64 minus its leading zeros, one
    instruction (LLVM's ctlz, defined at 0) where the shift-and-compare steps are a
    dependent chain of six."""
    return np.int64(64) - leading_zeros(np.int64(x))


#: Bits of an integer 0 <= x < 2**63 (0 for 0), for kernels' hot loops.
bit_length = _bit_length_shifts if numba_config.DISABLE_JIT else _bit_length_ctlz
