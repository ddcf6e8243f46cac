"""Byte-weighted LRU stack distances (Olken's method over a compacted time axis).

Conventions
-----------
- Sizes and distances are in **tokens** (bytes = tokens x kv_bytes_per_token, so a
  distance computed once serves every model).
- ``dist[t]`` is the byte depth of the accessed block ``b`` in the LRU recency stack:
  ``size[b]`` + the sizes of the distinct other blocks touched more recently than
  ``b``'s previous touch. A first access is a cold miss: ``dist = COLD`` (int64 max,
  "infinity").
- An LRU cache of capacity ``C`` tokens hits access ``t`` iff ``dist[t] <= C``. A block
  larger than ``C`` is never cached; it still passes through the stack (for
  ``C >= max(size)`` this is exactly an ordinary byte-LRU).
- ``dist_blocks[t]`` is the same depth counted in blocks (1 = the most recent block).
- Two models. *flat*: a sequential LRU over the chain-order access stream.
  *prefix-aware* (request-atomic): all accesses of a request are answered against the
  stack as the request found it, then its blocks are touched tail-first so that the
  prompt's first block ends up most recent (the cache stays prefix-closed).

Method
------
A Fenwick tree over touch "slots" holds, at the slot of each block's latest touch, the
block's size and a count of 1. The depth of ``b`` is the suffix sum after its slot.
Slots are handed out in touch order; when they run out, live slots are renumbered in
order and the tree is rebuilt in O(K), so memory stays O(distinct blocks) whatever the
number of accesses. Time O(N log M).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import NJIT

COLD = np.iinfo(np.int64).max

# Indices into the small scalar-state array.
_NEXT_SLOT, _TOTAL_TOKENS, _TOTAL_BLOCKS = 0, 1, 2


class StackState:
    """Kernel state carried across chunks of one stream (O(distinct blocks)).

    Parameters
    ----------
    n_blocks : int
        Number of distinct blocks M (dense ids 0..M-1).
    """

    def __init__(self, n_blocks: int) -> None:
        slots = 2 * int(n_blocks) + 64
        self.tree = np.zeros((slots + 1, 2), dtype=np.int64)  # [:, 0] tokens, [:, 1] blocks
        self.slot_block = np.full(slots, -1, dtype=np.int64)
        self.last_slot = np.full(int(n_blocks), -1, dtype=np.int64)
        self.last_request = np.full(int(n_blocks), -1, dtype=np.int64)
        self.scalars = np.zeros(3, dtype=np.int64)


@njit(**NJIT)
def _prefix(tree, slot):
    """Sums of tokens and blocks over slots 0..slot (inclusive)."""
    tokens = 0
    blocks = 0
    i = slot + 1
    while i > 0:
        tokens += tree[i, 0]
        blocks += tree[i, 1]
        i -= i & (-i)
    return tokens, blocks


@njit(**NJIT)
def _add(tree, slot, tokens, blocks):
    n = tree.shape[0] - 1
    i = slot + 1
    while i <= n:
        tree[i, 0] += tokens
        tree[i, 1] += blocks
        i += i & (-i)


@njit(**NJIT)
def _compact(tree, slot_block, last_slot, size, scalars):
    """Renumber live slots 0..live-1 in touch order and rebuild the tree in O(K)."""
    n = tree.shape[0] - 1
    live = 0
    for s in range(scalars[_NEXT_SLOT]):
        b = slot_block[s]
        if b >= 0:
            slot_block[s] = -1
            slot_block[live] = b
            last_slot[b] = live
            live += 1
    tree[:, :] = 0
    for s in range(live):
        b = slot_block[s]
        tree[s + 1, 0] += size[b]
        tree[s + 1, 1] += 1
    for i in range(1, n + 1):
        j = i + (i & (-i))
        if j <= n:
            tree[j, 0] += tree[i, 0]
            tree[j, 1] += tree[i, 1]
    scalars[_NEXT_SLOT] = live


@njit(**NJIT)
def _touch(b, request, size, tree, slot_block, last_slot, last_request, scalars):
    """Make block ``b`` the most recent one."""
    if scalars[_NEXT_SLOT] == slot_block.shape[0]:
        _compact(tree, slot_block, last_slot, size, scalars)
    old = last_slot[b]
    if old >= 0:
        _add(tree, old, -size[b], -1)
        slot_block[old] = -1
    else:
        scalars[_TOTAL_TOKENS] += size[b]
        scalars[_TOTAL_BLOCKS] += 1
    new = scalars[_NEXT_SLOT]
    scalars[_NEXT_SLOT] = new + 1
    _add(tree, new, size[b], 1)
    slot_block[new] = b
    last_slot[b] = new
    last_request[b] = request


@njit(**NJIT)
def _query(b, size, tree, last_slot, scalars):
    """(depth in tokens, depth in blocks) of ``b``; COLD if never touched."""
    s = last_slot[b]
    if s < 0:
        return COLD, COLD
    tokens, blocks = _prefix(tree, s)
    return size[b] + scalars[_TOTAL_TOKENS] - tokens, 1 + scalars[_TOTAL_BLOCKS] - blocks


@njit(**NJIT)
def stack_distances_chunk(
    block, size, req_start, first_request, prefix_aware,
    tree, slot_block, last_slot, last_request, scalars,
    dist, dist_blocks, prev_request,
):
    """Process requests ``req_start`` (local offsets into ``block``) of one chunk.

    ``first_request`` is the global index of the chunk's first request; outputs are
    written into ``dist``, ``dist_blocks`` and ``prev_request`` (same length as
    ``block``; pass empty arrays for the last two to skip them). State arrays are
    updated in place.
    """
    n_req = req_start.shape[0] - 1
    extra = dist_blocks.shape[0] > 0  # callers that only need dist pass empty arrays
    for r in range(n_req):
        lo = req_start[r]
        hi = req_start[r + 1]
        g = first_request + r
        if prefix_aware:
            for t in range(lo, hi):
                b = block[t]
                d, db = _query(b, size, tree, last_slot, scalars)
                dist[t] = d
                if extra:
                    dist_blocks[t] = db
                    prev_request[t] = last_request[b]
            for t in range(hi - 1, lo - 1, -1):
                _touch(block[t], g, size, tree, slot_block, last_slot, last_request, scalars)
        else:
            for t in range(lo, hi):
                b = block[t]
                d, db = _query(b, size, tree, last_slot, scalars)
                dist[t] = d
                if extra:
                    dist_blocks[t] = db
                    prev_request[t] = last_request[b]
                _touch(b, g, size, tree, slot_block, last_slot, last_request, scalars)


def stack_distances(block, size, req_start, prefix_aware):
    """Stack distances of a whole stream in one call.

    Parameters
    ----------
    block : int64[N]
        Dense block id of each access, in trace order.
    size : int64[M]
        Tokens each block occupies in a cache (>= 1).
    req_start : int64[R+1]
        Request offsets: the accesses of request r are ``req_start[r]:req_start[r+1]``.
    prefix_aware : bool
        Request-atomic prefix-aware model (True) or flat sequential LRU (False).

    Returns
    -------
    dist : int64[N]
        Depth in tokens (COLD for a first access).
    dist_blocks : int64[N]
        Depth in blocks (COLD for a first access).
    prev_request : int64[N]
        Request of the block's previous touch (-1 for a first access).
    """
    block = np.ascontiguousarray(block, dtype=np.int64)
    size = np.ascontiguousarray(size, dtype=np.int64)
    req_start = np.ascontiguousarray(req_start, dtype=np.int64)
    n = block.shape[0]
    state = StackState(size.shape[0])
    dist = np.empty(n, dtype=np.int64)
    dist_blocks = np.empty(n, dtype=np.int64)
    prev_request = np.empty(n, dtype=np.int64)
    if req_start.shape[0] > 1:
        stack_distances_chunk(
            block, size, req_start, 0, bool(prefix_aware),
            state.tree, state.slot_block, state.last_slot, state.last_request, state.scalars,
            dist, dist_blocks, prev_request,
        )
    return dist, dist_blocks, prev_request


@njit(**NJIT)
def usable_distances(dist, req_start):
    """Running max of ``dist`` inside each request (usable-prefix distance).

    Block j of request r is a usable-prefix hit at capacity C iff every block
    0..j of r hits, i.e. ``max(dist[r, 0..j]) <= C``. COLD propagates.
    """
    out = np.empty_like(dist)
    for r in range(req_start.shape[0] - 1):
        running = 0
        for t in range(req_start[r], req_start[r + 1]):
            if dist[t] > running:
                running = dist[t]
            out[t] = running
    return out
