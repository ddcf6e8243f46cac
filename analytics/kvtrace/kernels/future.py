"""Future reuse of each access: next access, reuses within a horizon, best keep schedule.

Conventions (shared with the twins of the same names in ``tests/naive.py``)
-----------------------------------------------------------------------------
- Accesses are in trace order and ``ts`` (seconds) is non-decreasing along it (the
  canonical trace guarantees this: requests are sorted by timestamp and every access
  carries its request's arrival).
- A *later* access of ``t`` is an access ``u > t`` in trace order of the same block.
  Access ``u`` is *within the horizon* of ``t`` iff ``ts[u] - ts[t] <= horizon``: the
  window is ``(t, ts[t] + horizon]`` in trace order, so a later access at the same
  timestamp (a tie: the next request of a burst, or a repeat inside a request) counts,
  also with ``horizon = 0``. ``horizon = inf`` counts every later access. Both kernel and
  twin compare the *gap* ``ts[u] - ts[t]`` with the horizon, so a boundary case rounds
  the same way in both.
- "None" is -1 for an index and ``inf`` for a gap.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE


@njit(**NJIT_INLINE)
def _close_window(s, p, count, cum_tokens, cum_q, ts, reuses, reuse_tokens, reuse_q, last_t, last_gap):
    """Close access s's window at p, the block's last access inside it: until now
    ``reuses[s]`` etc. held the block's running count and sums through s, and ``count``
    etc. are the block's running values through p, so the differences are the reuses."""
    reuses[s] = count - 1 - reuses[s]
    reuse_tokens[s] = cum_tokens - reuse_tokens[s]
    reuse_q[s] = cum_q - reuse_q[s]
    if reuses[s] > 0:
        last_t[s] = p
        last_gap[s] = ts[p] - ts[s]


@njit(**NJIT)
def future_windows(block, ts, tokens, pos_token_sum, n_blocks, horizon):
    """Next access and the reuses within a horizon of every access, in one O(N) pass.

    Parameters
    ----------
    block : int64[N]
        Dense block id of each access, 0..n_blocks-1, in trace order.
    ts : float64[N]
        Access time, seconds, non-decreasing.
    tokens : int64[N]
        Tokens of each access (summed over the reuses of a window).
    pos_token_sum : int64[N]
        Position-token sum ``q = k*s + k*(k-1)/2`` of each access's ``k`` tokens
        starting at prompt position ``s`` (prefill FLOPs of the access = a*k + b*q).
    n_blocks : int
        Number of distinct blocks M.
    horizon : float
        Window length, seconds, >= 0 (``inf`` allowed).

    Returns
    -------
    next_t : int64[N]
        Index of the next access of the same block; -1 for the block's last access.
    next_gap : float64[N]
        ``ts[next_t] - ts[t]``, seconds; ``inf`` when there is none.
    reuses : int64[N]
        Later accesses of the block within the horizon (see the module docstring).
    last_t : int64[N]
        Index of the last of those reuses; -1 when ``reuses == 0``.
    last_gap : float64[N]
        ``ts[last_t] - ts[t]``, seconds (how long the block must be held to serve all
        the reuses of the window); 0.0 when ``reuses == 0``.
    reuse_tokens : int64[N]
        Sum of ``tokens`` over those reuses.
    reuse_q : int64[N]
        Sum of ``pos_token_sum`` over those reuses.

    Notes
    -----
    A single forward pass with O(M) state besides the outputs. Access ``s``'s window is
    a run of the block's next accesses (``ts`` is non-decreasing, so gaps grow along the
    block's chain); it is *closed* by the first later access ``u`` of the block beyond
    the horizon, or by the end of the trace. Until then, ``reuses[s]``,
    ``reuse_tokens[s]`` and ``reuse_q[s]`` hold the block's running count and sums
    through ``s``; closing turns them into differences of running totals. Each block
    keeps a pointer to its oldest open window; the pointer only moves forward along
    the ``next_t`` chain, so every access is closed once: O(N + M) time.
    """
    n = block.shape[0]
    next_t = np.full(n, -1, dtype=np.int64)
    next_gap = np.full(n, np.inf, dtype=np.float64)
    reuses = np.zeros(n, dtype=np.int64)
    last_t = np.full(n, -1, dtype=np.int64)
    last_gap = np.zeros(n, dtype=np.float64)
    reuse_tokens = np.zeros(n, dtype=np.int64)
    reuse_q = np.zeros(n, dtype=np.int64)

    latest = np.full(n_blocks, -1, dtype=np.int64)  # the block's latest access so far
    oldest_open = np.full(n_blocks, -1, dtype=np.int64)  # its oldest still-open window
    count = np.zeros(n_blocks, dtype=np.int64)  # accesses of the block so far
    cum_tokens = np.zeros(n_blocks, dtype=np.int64)
    cum_q = np.zeros(n_blocks, dtype=np.int64)

    for u in range(n):
        b = block[u]
        p = latest[b]
        if p >= 0:
            next_t[p] = u
            next_gap[p] = ts[u] - ts[p]
        s = oldest_open[b]
        if s < 0:
            s = u
        # u lies beyond the horizon of s: s's window ends at p, the access before u
        while s != u and ts[u] - ts[s] > horizon:
            _close_window(s, p, count[b], cum_tokens[b], cum_q[b], ts, reuses, reuse_tokens, reuse_q, last_t,
                          last_gap)
            s = next_t[s]
        oldest_open[b] = s
        # running count and sums through u (rank of u = count before it)
        reuses[u] = count[b]
        cum_tokens[b] += tokens[u]
        cum_q[b] += pos_token_sum[u]
        reuse_tokens[u] = cum_tokens[b]
        reuse_q[u] = cum_q[b]
        count[b] += 1
        latest[b] = u

    # the end of the trace closes every open window at the block's last access
    for b in range(n_blocks):
        s = oldest_open[b]
        p = latest[b]
        while s >= 0:
            _close_window(s, p, count[b], cum_tokens[b], cum_q[b], ts, reuses, reuse_tokens, reuse_q, last_t,
                          last_gap)
            s = next_t[s]
    return next_t, next_gap, reuses, last_t, last_gap, reuse_tokens, reuse_q


@njit(**NJIT_INLINE)
def _keep_step(b, keepable, interval_value, write_cost, stored, free):
    """One access of block ``b`` in the programme of :func:`best_keep_value`."""
    best = max(stored[b], free[b])
    if keepable:
        stored[b] = max(stored[b], free[b] - write_cost) + interval_value
    else:
        stored[b] = -np.inf
    free[b] = best


@njit(**NJIT)
def best_keep_value(block, n_blocks, keepable, interval_value, write_cost):
    """Best net value per block over every keep/drop schedule (clairvoyant, unbounded).

    The *interval* of access ``t`` runs from ``t`` to the block's next access. A
    schedule keeps a set of keepable intervals; keeping interval ``t`` earns
    ``interval_value[t]`` (the next access's avoided compute minus its read and the
    occupancy of the gap), and every maximal run of consecutive kept intervals of a
    block pays one write, ``write_cost[block]`` (the block stays stored through the
    accesses inside a run). Keeping nothing is worth 0.

    Parameters
    ----------
    block : int64[N]
        Dense block id per access, trace order.
    n_blocks : int
        M.
    keepable : bool[N]
        Whether interval ``t`` may be kept (it has a next access within the horizon);
        ignored for a block's last access, which has no interval.
    interval_value : float64[N]
        Net value of keeping interval ``t``, $ (ignored where not keepable).
    write_cost : float64[M]
        Cost of writing the block once, $ (>= 0).

    Returns
    -------
    float64[M]
        The best schedule's value per block, $ (>= 0).

    Notes
    -----
    Two-state dynamic programme along each block's chain, O(N) time and O(M) state:
    after access ``t`` the block is either stored (its interval into ``t`` was kept) or
    not, and ``stored``/``free`` hold the best value so far in each state. After a
    block's last access, ``free`` holds the best over both states at that access.
    """
    stored = np.full(n_blocks, -np.inf, dtype=np.float64)
    free = np.zeros(n_blocks, dtype=np.float64)
    for t in range(block.shape[0]):
        b = block[t]
        _keep_step(b, keepable[t], interval_value[t], write_cost[b], stored, free)
    return free


@njit(**NJIT)
def best_keep_value_into(block, keepable, interval_value, access_write_cost, stored, free):
    """The dynamic programme of :func:`best_keep_value` over some accesses, carrying
    ``stored`` (float64[M], starts at -inf) and ``free`` (float64[M], starts at 0)
    from call to call: fed a trace chunk by chunk, ``free`` ends as its result.

    ``access_write_cost[t]`` (float64, $) is the cost of writing ``block[t]`` once,
    given per access so that a streamed caller holds no per-block array for it."""
    for t in range(block.shape[0]):
        _keep_step(block[t], keepable[t], interval_value[t], access_write_cost[t], stored, free)
