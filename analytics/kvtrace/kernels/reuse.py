"""The per-block visits of a chunked pass in trace order (O(M) state carried across
chunks): each access's previous request of its block, counts, first and last request."""

from __future__ import annotations

from numba import njit

from kvtrace.config import NJIT


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
