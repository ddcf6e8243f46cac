"""Exact stack distances of one stream on two cores: its two halves at once, then the
first touches of the later half resolved against the earlier half's final stack.

Cut the requests into an earlier part A and a later part B. An access of B whose block
B touched before has all of its reuse interval inside B: B's own stack, started empty
(:func:`kvtrace.kernels.stackdist.stack_distances_chunk` with ``open_past``), gives its
distance exactly. An access of B to a block B has not touched yet (a *first touch*) gets from B's pass
``-1 - beta``, ``beta`` the tokens of the distinct blocks B touched before it. Its
distance in the whole stream is then

    ``size[b] + beta + alpha``,  ``alpha`` = tokens of the blocks above ``b`` in A's final
    stack that B has not touched yet,

or COLD when A never touched ``b`` either: the blocks touched since b's last touch in A
are those above it in A's stack and those B touched before, and the ones in both are
counted once, in ``beta``. :func:`resolve_first_touches` walks B's first touches in
order on A's final stack, answers ``alpha`` by the same prefix sums as the kernel, and
removes each block from A's stack when B touches it (in the prefix-aware model after
the request's queries, as the kernel touches; in the flat model at once). This is the
split of parallel reuse-distance analysis (Niu, Dai, Ding and Li, "PARDA: A Fast
Parallel Reuse Distance Analysis Algorithm", IPDPS 2012) with A's stack as the carried
state.

Work: the two halves' passes run at once; the resolution is O(F log M) for F first
touches of B (at most B's distinct blocks), queried with the kernel's walk between
neighbouring slots (prompts reuse runs of blocks A touched together). Results equal the
one-pass kernel's, access by access.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.stackdist import COLD, SHIFT, TOTAL, walk_prefix


@njit(**NJIT)
def resolve_first_touches(block, size, req_start, prefix_aware, tree, offsets, slot_size, last_slot, scalars,
                          dist, pending):
    """Turn the first-touch marks (``dist < 0``) of one chunk of the later half into
    distances, in place, against the earlier half's final stack (module docstring),
    removing each block from that stack at its touch. Chunks are resolved in order.

    ``tree``, ``offsets``, ``slot_size``, ``last_slot``, ``scalars``: the earlier half's
    :class:`kvtrace.kernels.stackdist.StackState` after its last access (its walk cache
    is reset here; the state serves nothing else afterwards). ``pending``: scratch of at
    least the longest request's length."""
    top = offsets.shape[0] - 1
    total = scalars[TOTAL]
    cache_slot = -1
    cache_sum = np.int64(0)
    for r in range(req_start.shape[0] - 1):
        n_pending = 0
        for t in range(req_start[r], req_start[r + 1]):
            mark = dist[t]
            if mark >= 0:
                continue
            b = block[t]
            s = last_slot[b]
            if s < 0:
                dist[t] = COLD
                continue
            acc = walk_prefix(tree, offsets, slot_size, s, total, cache_slot, cache_sum)
            cache_slot = s
            cache_sum = acc
            dist[t] = size[b] + (-1 - mark) + (total - acc)
            if prefix_aware:
                pending[n_pending] = b
                n_pending += 1
            else:
                total, cache_sum = _remove(b, tree, offsets, slot_size, last_slot, top, total, cache_slot, cache_sum)
        for j in range(n_pending):
            total, cache_sum = _remove(pending[j], tree, offsets, slot_size, last_slot, top, total, cache_slot,
                                       cache_sum)
    scalars[TOTAL] = total


@njit(**NJIT)
def _remove(b, tree, offsets, slot_size, last_slot, top, total, cache_slot, cache_sum):
    """Take block ``b`` out of the earlier half's stack (when still there); returns the
    new live total and cached prefix sum."""
    s = last_slot[b]
    if s < 0:  # a block repeated inside one request: removed at its first occurrence
        return total, cache_sum
    sz = slot_size[s]
    i = s
    for level in range(1, top):
        i >>= SHIFT
        tree[offsets[level] + i] -= sz
    slot_size[s] = 0
    last_slot[b] = -1
    if s <= cache_slot:
        cache_sum -= sz
    return total - sz, cache_sum


def longest_request(req_start: np.ndarray) -> int:
    """Accesses of the longest request (the scratch ``pending`` needs)."""
    rs = np.asarray(req_start)
    return int(np.diff(rs).max()) if rs.shape[0] > 1 else 0


__all__ = ["longest_request", "resolve_first_touches"]
