"""Previous and next access of the same block (O(N), O(M) state), and the per-block
visits of a chunked pass."""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT


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


@njit(**NJIT)
def visit_blocks(block, request, pos, count, first_request, first_pos, last_request, prev_request):
    """One chunk of accesses in trace order, with per-block state carried across chunks.

    For each access t of the chunk: ``prev_request[t]`` is the request of the previous
    access of ``block[t]`` anywhere earlier in the trace (-1: its first access); the
    block's ``count`` grows by one; its ``first_request`` / ``first_pos`` are set on its
    first access (``count`` was 0); its ``last_request`` becomes ``request[t]``. The
    state arrays (length M, one per dense block id) start as zeros (``count``) and -1
    (``last_request``). A chunk is any run of consecutive accesses: feeding the trace
    in one chunk or many gives the same outputs.
    """
    for t in range(block.shape[0]):
        b = block[t]
        prev_request[t] = last_request[b]
        if count[b] == 0:
            first_request[b] = request[t]
            first_pos[b] = pos[t]
        count[b] += 1
        last_request[b] = request[t]
