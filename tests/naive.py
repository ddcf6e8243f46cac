"""Slow, obviously correct twins of the kernels (the specification).

Every kernel in :mod:`kvtrace.kernels` has a function of the same name here, written in
plain Python for clarity, not speed (O(N x M) and worse). Tests compare the kernels
with these twins on random and degenerate inputs.

Conventions shared with the kernels
-----------------------------------
- Sizes, distances and capacities are in tokens (one unit; bytes = tokens x
  kv_bytes_per_token).
- ``COLD`` (int64 max, "infinity") is the distance of a first access; its
  ``prev_request`` is -1.
- The accesses of request r are ``block[req_start[r]:req_start[r+1]]``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

COLD = int(np.iinfo(np.int64).max)


def _as_ints(a) -> list[int]:
    return [int(x) for x in np.asarray(a).ravel()]


def _check_trace(block: list[int], size: list[int], starts: list[int]) -> None:
    assert len(starts) >= 1 and starts[0] == 0 and starts[-1] == len(block), starts
    assert all(a <= b for a, b in zip(starts, starts[1:])), starts
    assert all(0 <= b < len(size) for b in block), (block, len(size))
    assert all(s >= 1 for s in size), size


def stack_distances(block, size, req_start, prefix_aware):
    """Byte-LRU stack distances, by walking an explicit recency list.

    Parameters
    ----------
    block : int[N]
        Dense block id of each access, in trace order.
    size : int[M]
        Tokens each block occupies (>= 1).
    req_start : int[R+1]
        Request offsets.
    prefix_aware : bool
        True: request-atomic model (every access of request r is answered against
        the recency list as r found it; then r's blocks are touched tail-first, so
        position 0 ends most recent). False: a plain sequential LRU (each access
        queries, then touches).

    Returns
    -------
    dist, dist_blocks, prev_request : int64[N]
        Depth of the block in the recency list in tokens (own size included) and in
        blocks (1 = most recent), and the request of its previous touch; COLD, COLD,
        -1 for a first access.
    """
    block, size, starts = _as_ints(block), _as_ints(size), _as_ints(req_start)
    _check_trace(block, size, starts)
    n = len(block)
    dist, dist_blocks, prev_request = [COLD] * n, [COLD] * n, [-1] * n
    recency: list[int] = []  # most recent first
    last_request: dict[int, int] = {}

    def query(t: int) -> None:
        b = block[t]
        if b in recency:
            depth = recency.index(b) + 1
            dist[t] = sum(size[x] for x in recency[:depth])
            dist_blocks[t] = depth
            prev_request[t] = last_request[b]

    def touch(t: int, r: int) -> None:
        b = block[t]
        if b in recency:
            recency.remove(b)
        recency.insert(0, b)
        last_request[b] = r

    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        if prefix_aware:
            for t in range(lo, hi):
                query(t)
            for t in reversed(range(lo, hi)):
                touch(t, r)
        else:
            for t in range(lo, hi):
                query(t)
                touch(t, r)

    as_array = lambda xs: np.array(xs, dtype=np.int64).reshape(n)  # noqa: E731
    return as_array(dist), as_array(dist_blocks), as_array(prev_request)


def usable_distances(dist, req_start):
    """Usable-prefix distance: ``u[r, j] = max(dist[r, 0..j])``; COLD propagates."""
    dist, starts = _as_ints(dist), _as_ints(req_start)
    out = []
    for r in range(len(starts) - 1):
        request = dist[starts[r]:starts[r + 1]]
        out.extend(max(request[: j + 1]) for j in range(len(request)))
    return np.array(out, dtype=np.int64).reshape(len(out))


def lru_simulate(block, size, req_start, capacity, prefix_aware):
    """Replay the trace through an explicit byte-LRU of ``capacity`` tokens.

    A miss inserts the block as most recent, then evicts least-recent blocks until
    the cache holds at most ``capacity`` tokens; a block larger than ``capacity``
    therefore evicts everything, itself last, and is never cached. A hit only moves
    the block to most recent.

    flat: each access checks membership (hit), then touches. prefix-aware: all hits
    of request r are decided against the cache as r found it, then r's blocks are
    touched tail-first.

    Returns
    -------
    hits : bool[N]
    cache_after_each_request : list[set[int]]
        The cached block ids after each request (one entry per request, empty
        requests included).
    """
    block, size, starts = _as_ints(block), _as_ints(size), _as_ints(req_start)
    _check_trace(block, size, starts)
    capacity = int(capacity)
    cache: OrderedDict[int, int] = OrderedDict()  # least recent first
    used = 0
    hits = [False] * len(block)
    after: list[set[int]] = []

    def touch(b: int) -> None:
        nonlocal used
        if b in cache:
            cache.move_to_end(b)
            return
        cache[b] = size[b]
        used += size[b]
        while used > capacity:
            _, evicted = cache.popitem(last=False)
            used -= evicted

    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        if prefix_aware:
            for t in range(lo, hi):
                hits[t] = block[t] in cache
            for t in reversed(range(lo, hi)):
                touch(block[t])
        else:
            for t in range(lo, hi):
                hits[t] = block[t] in cache
                touch(block[t])
        assert used == sum(cache.values()) and used <= capacity
        after.append(set(cache))
    return np.array(hits, dtype=bool).reshape(len(hits)), after
