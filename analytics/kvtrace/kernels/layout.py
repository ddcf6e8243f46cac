"""Access-table layout helpers."""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT


@njit(**NJIT)
def request_and_pos(req_start):
    """Request index (int64) and position in the request (int32) of every access."""
    n = req_start[-1]
    request = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int32)
    for r in range(req_start.shape[0] - 1):
        lo = req_start[r]
        for t in range(lo, req_start[r + 1]):
            request[t] = r
            pos[t] = t - lo
    return request, pos
