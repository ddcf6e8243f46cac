"""Future reuse of each access: next access, reuses within a horizon, best keep schedule.

Every kernel here runs over a trace chunk by chunk with its per-block state carried
from call to call (O(distinct blocks) state, no O(accesses) array); an in-memory trace
is fed the same way, so there is one implementation whatever the source.

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

Passes
------
- :func:`next_access_chunk`, run over the chunks **last to first**, gives every
  access its block's next access, the gap to it and a per-access quantity of that
  next access (one index, time and value per block carried back).
- :func:`lead_lag_windows`, run by two cursors over the same accesses: the *lead*
  counts each block's accesses and running token sums; the *lag* closes access
  ``s``'s window as soon as the lead meets the first access ``u`` (of any block) with
  ``ts[u] - ts[s] > horizon``. Since ``ts`` is non-decreasing nothing from ``u`` on is
  in the window, and the lead's per-block running values at that moment are those
  through the window's last access: the window's reuses are their differences with
  the lag's own running values through ``s``. The end of the trace closes the rest
  (with ``horizon = inf`` the lead reads the whole trace first: the closed form from
  the blocks' totals).
- :func:`best_keep_value_into`, the keep/drop dynamic programme, and
  :func:`block_extent`, each block's first and last request, in trace order.

:func:`future_windows` and :func:`best_keep_value` run the same kernels over one
chunk holding a whole trace (the form the twins specify).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE


@njit(**NJIT)
def next_access_chunk(block, lo, ts, value, nxt, nxt_ts, nxt_value, next_t, next_gap, next_value):
    """Next access of every access of one chunk, the chunks visited last to first.

    Parameters
    ----------
    block : int64[m]
        Dense block ids of accesses ``lo .. lo + m - 1``.
    lo : int
        Trace index of the chunk's first access.
    ts : float64[m]
        Access times, seconds.
    value : float64[m]
        A quantity of each access handed back to the previous access of its block
        (the value report: the GPU-seconds of prefill the access costs).
    nxt, nxt_ts, nxt_value : [M], carried state
        Each block's earliest access after the chunk (int32 or int64 trace index, -1:
        none), its time and its ``value``. Updated.
    next_t : int64[m]
        Output: trace index of the next access of the same block, -1 for none.
    next_gap : float64[m]
        Output: ``ts`` of the next access minus ``ts``, seconds; inf for none.
    next_value : float64[m]
        Output: ``value`` of the next access; 0.0 for none.
    """
    for i in range(block.shape[0] - 1, -1, -1):
        b = block[i]
        j = nxt[b]
        next_t[i] = j
        if j >= 0:
            next_gap[i] = nxt_ts[b] - ts[i]
            next_value[i] = nxt_value[b]
        else:
            next_gap[i] = np.inf
            next_value[i] = 0.0
        nxt[b] = lo + i
        nxt_ts[b] = ts[i]
        nxt_value[b] = value[i]


@njit(**NJIT)
def lead_lag_windows(lead_block, lead_ts, lead_tokens, lead_q, lead_lo, i,
                     lag_block, lag_ts, lag_tokens, lag_q, j, horizon, final,
                     count, cum_tokens, cum_q, latest, latest_ts, closed, closed_tokens, closed_q, prev_keep,
                     reuses, last_t, last_gap, reuse_tokens, reuse_q, starts_stay):
    """Advance both cursors until the lag's chunk is closed or the lead's is read.

    Parameters
    ----------
    lead_block, lead_ts, lead_tokens, lead_q : arrays of the lead's chunk
        Dense block id (int64), time (float64, seconds), tokens and position-token
        sum ``q = k*s + k*(k-1)/2`` of the access's ``k`` tokens from prompt position
        ``s`` (int64) of accesses ``lead_lo ..``.
    i : int
        Next unread access of the lead's chunk.
    lag_block, lag_ts, lag_tokens, lag_q : arrays of the lag's chunk
        The same for the chunk whose windows are being closed.
    j : int
        Next open window of the lag's chunk.
    horizon : float
        Seconds, >= 0 (inf allowed).
    final : bool
        The lead has read the whole trace: close every window.
    count, cum_tokens, cum_q : per-block state of the lead, [M]
        Accesses (int32 when the trace has < 2**31 accesses, else int64), token sum
        and position-token sum (int64) read by the lead. Updated.
    latest : int32 or int64[M], or empty
        Trace index of each block's latest access read by the lead (-1: none).
        Updated. Empty: not tracked, and ``last_t`` is not written (may be empty).
    latest_ts : float64[M]
        Time of each block's latest access read by the lead. Updated.
    closed, closed_tokens, closed_q : per-block state of the lag, [M]
        Accesses (as ``count``), token sum and position-token sum closed by the lag.
        Updated.
    prev_keep : bool[M]
        Whether each block's latest closed window holds a reuse. Updated.
    reuses : int64[m]
        Output: later accesses of the block within the horizon.
    last_t : int64[m]
        Output: index of the last of those reuses; -1 when ``reuses == 0``.
    last_gap : float64[m]
        Output: seconds from the access to that last reuse (how long the block must be
        held to serve all the reuses of the window); 0.0 when ``reuses == 0``.
    reuse_tokens, reuse_q : int64[m]
        Output: sums of the tokens and position-token sums of those reuses.
    starts_stay : bool[m]
        Output: the previous access of the block has no reuse within the horizon (or
        there is none): the time-to-live schedule writes the block here.

    Returns
    -------
    (i, j) : the cursors; ``j == len(lag_block)``: the lag's chunk is complete;
    else ``i == len(lead_block)``: the lead needs its next chunk.
    """
    n_lead = lead_block.shape[0]
    n_lag = lag_block.shape[0]
    track = latest.shape[0] > 0
    while j < n_lag:
        if not final:
            if i == n_lead:
                break
            if not lead_ts[i] - lag_ts[j] > horizon:
                # the lead's access is within the oldest open window: read it
                b = lead_block[i]
                count[b] += 1
                cum_tokens[b] += lead_tokens[i]
                cum_q[b] += lead_q[i]
                if track:
                    latest[b] = lead_lo + i
                latest_ts[b] = lead_ts[i]
                i += 1
                continue
        # close the window of lag access j
        b = lag_block[j]
        rank = closed[b]
        closed[b] = rank + 1
        closed_tokens[b] += lag_tokens[j]
        closed_q[b] += lag_q[j]
        r = count[b] - 1 - rank
        reuses[j] = r
        reuse_tokens[j] = cum_tokens[b] - closed_tokens[b]
        reuse_q[j] = cum_q[b] - closed_q[b]
        if r > 0:
            if track:
                last_t[j] = latest[b]
            last_gap[j] = latest_ts[b] - lag_ts[j]
        else:
            if track:
                last_t[j] = -1
            last_gap[j] = 0.0
        starts_stay[j] = not prev_keep[b]
        prev_keep[b] = r > 0
        j += 1
    return i, j


@njit(**NJIT_INLINE)
def _keep_step(b, keepable, interval_value, write_cost, stored, free):
    """One access of block ``b`` in the programme of :func:`best_keep_value_into`."""
    best = max(stored[b], free[b])
    if keepable:
        stored[b] = max(stored[b], free[b] - write_cost) + interval_value
    else:
        stored[b] = -np.inf
    free[b] = best


@njit(**NJIT)
def best_keep_value_into(block, keepable, interval_value, access_write_cost, stored, free):
    """Best net value per block over every keep/drop schedule (clairvoyant, unbounded),
    over some accesses in trace order, carrying ``stored`` (float64[M], starts at -inf)
    and ``free`` (float64[M], starts at 0) from call to call: fed a trace chunk by
    chunk, ``free`` ends as the best schedule's value per block, $ (>= 0).

    The *interval* of access ``t`` runs from ``t`` to the block's next access. A
    schedule keeps a set of keepable intervals; keeping interval ``t`` earns
    ``interval_value[t]`` (the next access's avoided compute minus its read and the
    occupancy of the gap), and every maximal run of consecutive kept intervals of a
    block pays one write, ``access_write_cost[t]`` (float64, $: the cost of writing
    ``block[t]`` once; the block stays stored through the accesses inside a run).
    Keeping nothing is worth 0. ``keepable[t]``: interval ``t`` has a next access within
    the horizon (ignored for a block's last access, which has no interval).

    Two-state dynamic programme along each block's chain, O(N) time and O(M) state:
    after access ``t`` the block is either stored (its interval into ``t`` was kept) or
    not, and ``stored``/``free`` hold the best value so far in each state. After a
    block's last access, ``free`` holds the best over both states at that access.
    """
    for t in range(block.shape[0]):
        _keep_step(block[t], keepable[t], interval_value[t], access_write_cost[t], stored, free)


@njit(**NJIT)
def block_extent(block, local_req, req_lo, first_req, last_req, new):
    """First and last request of each block, one chunk of whole requests at a time.

    ``first_req`` starts at -1 (unseen); ``req_lo`` is the chunk's first request and
    ``local_req`` each access's request within the chunk. The blocks first seen in the
    chunk are written to ``new`` (int64[m]) in order of appearance; returns their number.
    """
    n_new = 0
    for t in range(block.shape[0]):
        b = block[t]
        r = local_req[t]
        if first_req[b] < 0:
            first_req[b] = req_lo + r
            new[n_new] = b
            n_new += 1
        last_req[b] = req_lo + r
    return n_new


def future_windows(block, ts, tokens, pos_token_sum, n_blocks, horizon):
    """Next access and the reuses within a horizon of every access of a whole trace:
    :func:`next_access_chunk` and :func:`lead_lag_windows` over one chunk.

    Parameters
    ----------
    block : int64[N]
        Dense block id of each access, 0..n_blocks-1, in trace order.
    ts : float64[N]
        Access time, seconds, non-decreasing.
    tokens : int64[N]
        Tokens of each access (summed over the reuses of a window).
    pos_token_sum : int64[N]
        Position-token sum ``q`` of each access (prefill FLOPs of the access = a*k + b*q).
    n_blocks : int
        Number of distinct blocks M.
    horizon : float
        Window length, seconds, >= 0 (``inf`` allowed).

    Returns
    -------
    (next_t, next_gap, reuses, last_t, last_gap, reuse_tokens, reuse_q)
        int64, float64, int64, int64, float64, int64, int64 [N], as the outputs of the
        two kernels.
    """
    block, ts = np.asarray(block, np.int64), np.asarray(ts, np.float64)
    tokens, q = np.asarray(tokens, np.int64), np.asarray(pos_token_sum, np.int64)
    n = block.shape[0]
    next_t, next_gap = np.empty(n, np.int64), np.empty(n, np.float64)
    next_access_chunk(block, 0, ts, np.zeros(n), np.full(n_blocks, -1, np.int64), np.zeros(n_blocks),
                      np.zeros(n_blocks), next_t, next_gap, np.empty(n))
    reuses, last_t, last_gap = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float64)
    reuse_tokens, reuse_q, starts = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.bool_)
    zeros = [np.zeros(n_blocks, np.int64) for _ in range(6)]
    state = (zeros[0], zeros[1], zeros[2], np.full(n_blocks, -1, np.int64), np.zeros(n_blocks), zeros[3],
             zeros[4], zeros[5], np.zeros(n_blocks, np.bool_))
    out = (reuses, last_t, last_gap, reuse_tokens, reuse_q, starts)
    i, j = lead_lag_windows(block, ts, tokens, q, 0, 0, block, ts, tokens, q, 0, float(horizon), False, *state, *out)
    if j < n:  # the lead has read every access: the end of the trace closes the rest
        lead_lag_windows(block[:0], ts[:0], tokens[:0], q[:0], 0, 0, block, ts, tokens, q, j, float(horizon), True,
                         *state, *out)
    return next_t, next_gap, reuses, last_t, last_gap, reuse_tokens, reuse_q


def best_keep_value(block, n_blocks, keepable, interval_value, write_cost):
    """:func:`best_keep_value_into` over a whole trace (``write_cost``: float64[M], $ per
    write of each block); returns float64[M], the best schedule's value per block, $."""
    block = np.asarray(block, np.int64)
    stored = np.full(n_blocks, -np.inf, dtype=np.float64)
    free = np.zeros(n_blocks, dtype=np.float64)
    best_keep_value_into(block, np.asarray(keepable), np.asarray(interval_value, np.float64),
                         np.asarray(write_cost, np.float64)[block], stored, free)
    return free
